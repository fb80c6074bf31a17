"""The pilots' rules (benchmarks/effect/PILOT.md, DEFAULT_PILOT.md) applied to made-up gains: which cell each
chooses; and the tasks and runs around them."""

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.effect.pilot import (
    DEFAULT_MLM_PILOT,
    ISSUE_60,
    SEED,
    TRAINED_LINES,
    check_frozen,
    choice,
    gains,
)


def figures(gains: dict[int, float], costs: dict[int, float] | None = None,
            grid: tuple = ISSUE_60.grid) -> dict[int, dict[str, float]]:
    return {c.number: {"gain": gains.get(c.number, 0.0), "projected_seconds": (costs or {}).get(c.number, 0.0)}
            for c in grid}


def test_incomplete_grid_chooses_nothing() -> None:
    found = figures({})
    del found[10]
    assert choice(found).startswith("Incomplete: 9 of 10 cells")


def test_gaining_minilm_cells_within_half_a_point_go_to_the_fewest_passes() -> None:
    # cell 8 (20 passes) is best, cell 1 (5 passes) within 0.5 points of it; the small cells gain more
    gains = {1: 2.6, 2: -1.0, 3: 0.5, 4: 5.0, 6: 7.0, 8: 3.0, 9: 1.2, 10: 2.0}
    assert choice(figures(gains)).startswith("**Chosen (rule 3):** cell 1, learning rate 0.0001, 5 passes")


def test_a_far_better_longer_cell_wins() -> None:
    gains = {1: 1.1, 8: 3.0}
    assert choice(figures(gains)).startswith("**Chosen (rule 3):** cell 8, learning rate 0.0001, 20 passes")


def test_no_minilm_cell_gaining_is_said_and_the_best_point_estimate_taken() -> None:
    gains = {1: -3.0, 2: 0.9, 3: -0.2, 6: 6.4, 8: 0.2, 9: -7.5, 10: 0.99}
    text = choice(figures(gains))
    assert text.startswith("**Chosen (rule 4):** cell 10, learning rate 3e-05, 20 passes")
    assert "the control failed at every MiniLM setting tried" in text


def default_choice(gains: dict[int, float], costs: dict[int, float]) -> str:
    return choice(figures(gains, costs, DEFAULT_MLM_PILOT.grid), DEFAULT_MLM_PILOT)


def test_the_default_model_pilot_takes_the_fewest_passes_that_pass_within_the_ceiling() -> None:
    # cells 1-2 (1 pass) fail; 3 and 4 (2 passes) pass within 3,600 s, 4 with the larger gain; 6 gains more
    costs = {1: 700, 2: 700, 3: 1300, 4: 1300, 5: 2500, 6: 2500, 7: 5000, 8: 5000}
    gains = {1: 0.99, 2: -0.5, 3: 1.2, 4: 1.5, 5: 3.0, 6: 4.0, 7: 5.0, 8: 6.0}
    assert default_choice(gains, costs).startswith("**Chosen (rule 3):** cell 4, learning rate 0.0003, 2 passes")
    # over the ceiling, the cheapest passing cell, its cost said; a failing cell is never chosen
    text = default_choice({5: 1.0, 7: 5.0, 8: 6.0}, {**costs, 3: 100, 5: 3650})
    assert text.startswith("**Chosen (rule 4):** cell 5, learning rate 0.0001, 4 passes")
    assert "none within 3600 s" in text and "projected at 3650 s" in text
    # at the ceiling is within it
    assert default_choice({5: 1.0, 7: 5.0}, {**costs, 5: 3600.0}).startswith("**Chosen (rule 3):** cell 5")


def test_the_default_model_pilot_says_when_no_cell_passes() -> None:
    gains = {1: -3.0, 2: 0.2, 3: 0.9, 4: -1.0, 5: 0.5, 6: 0.99, 7: 0.1, 8: -2.0}
    text = default_choice(gains, dict.fromkeys(range(1, 9), 100.0))
    assert text.startswith("**Chosen (rule 5):** cell 6, learning rate 0.0003, 4 passes")
    assert "the control failed in the pilot at every setting tried" in text
    found = figures(gains, grid=DEFAULT_MLM_PILOT.grid)
    del found[8]
    assert choice(found, DEFAULT_MLM_PILOT).startswith("Incomplete: 7 of 8 cells")


def test_the_projected_cost_is_nones_probe_and_ten_trained_lines(tmp_path: Path) -> None:
    """A default run trains `random` and `difference` once per default seed: the cost projects that many
    `random` lines (TAPT and probe) and `none`'s probe, from a cell's own result lines."""
    from maskstream.evaluate.design import EvaluateConfig

    assert len([a for a in EvaluateConfig.arms if a != "none"]) * len(EvaluateConfig.seeds) == TRAINED_LINES

    def arm(name: str, passes: float, tapt: float, probe: float, f1: float, resumed: int | None = None) -> dict:
        folds = [{"seconds": {"tapt": tapt, "probe": probe},
                  "pretraining": {"steps": 40, "resumed_from_step": resumed} if passes else None}] * 2
        return {"kind": "arm", "base_hash": "b1", "config_hash": f"{name}{passes}", "arm": name, "seed": SEED,
                "passes": passes, "macro_f1": f1, "folds": folds}

    lines = [{"kind": "prepared", "base_hash": "b1", "model": {"name": "english_mlm"},
              "settings": {"learning_rate": 1e-4}},
             {"kind": "prepared", "base_hash": "b2", "model": {"name": "english_mlm"},
              "settings": {"learning_rate": 3e-4}},
             arm("none", 0.0, 0.0, 5.0, 0.70), arm("random", 1.0, 40.0, 6.0, 0.72),
             arm("random", 2.0, 60.0, 6.0, 0.69, resumed=10)]  # timed 30 of its 40 steps
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = gains(results, DEFAULT_MLM_PILOT)
    assert sorted(found) == [1, 3]  # the 3e-4 evaluation has no lines yet
    assert found[1]["gain"] == pytest.approx(2.0) and found[3]["gain"] == pytest.approx(-1.0)
    assert found[1]["projected_seconds"] == pytest.approx(2 * 5.0 + 10 * 2 * (40.0 + 6.0))
    assert found[3]["tapt_minutes"] == pytest.approx(2 * 80 / 60) and found[3]["resumed"] and not found[1]["resumed"]


def test_this_checkout_runs_its_own_packages() -> None:
    check_frozen()  # raises SystemExit when a package loads from another checkout


def test_the_second_task_is_the_pinned_file_and_its_rule_holds(tmp_path: Path) -> None:
    """The committed docstring task is the pinned bytes; its rule, on a made-up standard library, keeps a
    text once per package, drops one found in two packages and takes the largest packages."""
    from benchmarks.effect import second_corpus
    from benchmarks.effect.configs import SECOND_TASK

    repo = Path(__file__).resolve().parents[1]
    data = (repo / SECOND_TASK["path"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == SECOND_TASK["sha256"]
    rows = [json.loads(line) for line in data.decode("utf-8").splitlines()]
    assert len(rows) == 2439 and len({r["text"] for r in rows}) == len(rows)
    assert len(Counter(r[SECOND_TASK["label_field"]] for r in rows)) == second_corpus.PACKAGES

    words = "one two three four five six seven eight nine ten"
    stdlib = tmp_path / "lib"
    for package, bodies in {"big": [f"{words} {i}" for i in range(3)] + [f"{words} 0", f"{words} shared"],
                            "mid": [f"{words} m{i}" for i in range(2)] + [f"{words} shared"],
                            "test": [f"{words} t{i}" for i in range(9)], "small": [f"{words} s"]}.items():
        (stdlib / package).mkdir(parents=True)
        functions = "".join(f'def f{i}():\n    """{body}"""\n' for i, body in enumerate(bodies))
        (stdlib / package / "module.py").write_text(f'"""too short"""\n{functions}')
    (stdlib / "single.py").write_text(f'"""{words} single"""\n')
    found = second_corpus.docstrings(stdlib)
    assert {r["package"] for r in found} == {"big", "mid", "small"}  # no test suite, no single-file module
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(second_corpus, "PACKAGES", 2)
    task = second_corpus.task(found)
    monkeypatch.undo()
    assert [(r["package"], r["text"].removeprefix(words + " ")) for r in task] == [
        ("big", "0"), ("big", "1"), ("big", "2"), ("mid", "m0"), ("mid", "m1")]


@pytest.mark.slow  # parses the whole standard library: about 10 s
@pytest.mark.skipif(sys.version_info[:3] != (3, 11, 7), reason="the task was made from CPython 3.11.7's library")
def test_the_second_task_is_made_again_byte_for_byte(tmp_path: Path) -> None:
    from benchmarks.effect import second_corpus
    from benchmarks.effect.configs import SECOND_TASK

    out = tmp_path / "task.jsonl"
    second_corpus.main([str(out)])
    assert hashlib.sha256(out.read_bytes()).hexdigest() == SECOND_TASK["sha256"]


WORDS = [f"w{i}" for i in range(400)]


@settings(max_examples=40, deadline=None)
@given(families=st.lists(st.tuples(st.sampled_from(["libs", "python", "rare", "unknown"]),
                                   st.integers(1, 4), st.integers(0, 10**6)), min_size=1, max_size=40),
       labeled_share=st.floats(0.2, 0.8), min_label_share=st.sampled_from([0.0, 0.05, 0.3]))
def test_the_sections_task_splits_whole_clusters_and_labels_the_large_sections(families, labeled_share,
                                                                              min_label_share) -> None:
    """Families of near-duplicates (one text and copies differing in its last word) in drawn sections:
    checked against every pair, no labeled text has a near-duplicate in the general corpus and no two
    general texts are near-duplicates; computed again from the clusters, the labeled half is the clusters
    whose first text hashes below the share, the labels its sections (never `unknown`) holding at least
    `min_label_share` of it, the task every text of the half with a label, the general corpus the first
    text of every other cluster."""
    from benchmarks.effect.sections_task import cluster_position, split_by_cluster
    from maskstream.evaluate import neardup

    documents = []
    for family, (section, copies, draw) in enumerate(families):
        body = " ".join(WORDS[(draw + 7 * i) % len(WORDS)] for i in range(12)) + f" f{family}"
        documents += [{"package": f"p{family}-{c}", "section": section, "text": f"{body} copy{c}"}
                      for c in range(copies)]
    labeled, general, counts = split_by_cluster(documents, labeled_share, min_label_share)
    pairs = [(a, b) for a in labeled for b in general]
    assert not any(neardup.near_duplicates(a["text"], b["text"]) for a, b in pairs)
    assert not any(neardup.near_duplicates(a["text"], b["text"]) for i, a in enumerate(general) for b in general[i + 1:])
    # the rule computed again: each cluster's half from its first text's hash, the labels from that half
    cluster_of = neardup.clusters([d["text"] for d in documents])
    first: dict[int, dict] = {}
    for document, cluster in zip(documents, cluster_of, strict=True):
        first.setdefault(cluster, document)
    in_half = [cluster_position(first[c]["text"]) < labeled_share for c in cluster_of]
    half = [d for d, inside in zip(documents, in_half, strict=True) if inside]
    sizes = Counter(d["section"] for d in half if d["section"] != "unknown")
    labels = {s for s, n in sizes.items() if n >= min_label_share * len(half)}
    assert set(counts["labels"]) == labels and counts["labeled_half"] == len(half)
    assert labeled == [d for d in half if d["section"] in labels]
    assert general == [first[c] for c in dict.fromkeys(c for c, inside in zip(cluster_of, in_half, strict=True)
                                                          if not inside)]
    assert counts["labeled"] + sum(counts["dropped_sections"].values()) == len(half)


def test_the_sections_task_is_the_pinned_pair_of_files() -> None:
    """Issue 61's files are the pinned bytes: at least 27,000 labeled descriptions in 25 sections, none also
    in the general corpus."""
    import gzip

    from benchmarks.effect.configs import SECTIONS_GENERAL_CORPUS, SECTIONS_TASK
    from benchmarks.effect.sections_task import MIN_LABELED_TEXTS

    repo = Path(__file__).resolve().parents[1]
    rows = {}
    for name, pin in (("labeled", SECTIONS_TASK), ("general", SECTIONS_GENERAL_CORPUS)):
        data = (repo / pin["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == pin["sha256"]
        rows[name] = [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines()]
    labels = Counter(r[SECTIONS_TASK["label_field"]] for r in rows["labeled"])
    assert len(rows["labeled"]) >= MIN_LABELED_TEXTS and len(labels) == 25 and "unknown" not in labels
    assert min(labels.values()) >= 0.01 * len(rows["labeled"])
    assert not {r["text"] for r in rows["labeled"]} & {r["text"] for r in rows["general"]}


def test_the_default_runs_change_no_option_but_the_task_and_where_it_writes(tmp_path: Path) -> None:
    """Issue 60's default runs are the command at its defaults: their arguments differ from those of a bare
    `maskstream evaluate --labeled L --output O` only in the labeled file, its label field, the output and
    the scratch folder."""
    from benchmarks.effect.defaults_run import TASKS, command_line, parsed

    bare = vars(parsed(["--labeled", "x.jsonl", "--output", "out"]))
    for task in TASKS:
        args = vars(parsed(command_line(task, tmp_path / "out", tmp_path / "work")))
        assert {k for k in args if args[k] != bare[k]} == {"labeled", "label_field", "output", "work"}
        assert Path(args["labeled"]).is_file()


def test_evaluate_defaults_are_the_default_model_pilots_choice() -> None:
    """The defaults of `maskstream evaluate` (the command's and EvaluateConfig's) are the shipped model and the
    passes and learning rate of the cell DEFAULT_PILOT.md's rule chooses from the committed results."""
    import argparse
    import dataclasses

    from benchmarks.effect.pilot import DEFAULT_MLM_PILOT, chosen, model_path
    from maskstream.cli.evaluate import add_arguments
    from maskstream.evaluate.design import EvaluateConfig
    from maskstream.models import default_mlm

    results = Path(__file__).resolve().parents[1] / "benchmarks/effect/results/default-pilot/results.jsonl"
    made = chosen(gains(results, DEFAULT_MLM_PILOT), DEFAULT_MLM_PILOT)
    assert made is not None and model_path(made.cell.model) == default_mlm()
    cell = made.cell
    assert (EvaluateConfig.passes, EvaluateConfig.learning_rate) == ((cell.passes,), cell.learning_rate)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    command = vars(parser.parse_args(["--labeled", "x.jsonl", "--output", "out"]))
    assert command["model"] == default_mlm()
    fields = {f.name: f.default for f in dataclasses.fields(EvaluateConfig) if f.default is not dataclasses.MISSING}
    assert {name: command[name] for name in fields} == fields  # one place for every default


def test_readouts_saved_from_one_work_folder_restore_into_a_fresh_one(tmp_path: Path) -> None:
    """What a fresh machine gets back: every fold's readout, at its place, none overwritten."""
    from benchmarks.effect.defaults_run import copy_readouts, readouts

    work, saved, fresh = tmp_path / "work", tmp_path / "saved", tmp_path / "fresh"
    for relative in ("tapt/passes5/random/seed0/fold0", "tapt/passes5/difference/seed3/fold1"):
        (work / relative).mkdir(parents=True)
        (work / relative / "readout.json").write_text(relative)
    (work / "tapt/passes5/random/seed0/fold1").mkdir(parents=True)  # a fold still running: no readout
    assert len(copy_readouts(work, saved)) == 2 and copy_readouts(work, saved) == []
    (fresh / "tapt/passes5/random/seed0/fold0").mkdir(parents=True)
    (fresh / "tapt/passes5/random/seed0/fold0/readout.json").write_text("kept")
    assert len(copy_readouts(saved, fresh)) == 1
    assert readouts(fresh) == readouts(work)
    assert (fresh / "tapt/passes5/random/seed0/fold0/readout.json").read_text() == "kept"
    assert copy_readouts(tmp_path / "nothing saved", fresh) == []

"""The effect experiment (benchmarks/effect): near-duplicate-free splits, the seed-level statistics
against scipy, the report's gate, and the whole harness (prepare, pilot, run, report) on a labeled
set made here, as a user would run it on their own data."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from benchmarks.effect import neardup, paired, report, run

REPO = Path(__file__).resolve().parents[1]
EFFECT = REPO / "benchmarks" / "effect"


def test_near_duplicates_are_clustered_and_found_exactly() -> None:
    base = "a solver for sparse linear systems of equations with iterative methods and preconditioners"
    texts = [base, base + " written in C", "Tools for gene alignment of short reads", base.upper(),
             "tools for gene alignment of short reads and long reads", "an unrelated circuit simulator"]
    ids = neardup.clusters(texts)
    assert ids[0] == ids[1] == ids[3] and ids[2] == ids[4] and len(set(ids)) == 3
    assert neardup.near_duplicates(texts[0], texts[1]) and not neardup.near_duplicates(texts[0], texts[5])
    kept, dropped = neardup.drop_near_duplicates(texts, [base])
    assert kept == [2, 4, 5] and dropped == 3


def test_paired_statistics_match_scipy_and_simulation() -> None:
    from scipy import stats

    arm = {0: 0.71, 1: 0.74, 2: 0.69, 3: 0.73, 4: 0.75, 5: 0.70}
    base = {0: 0.70, 1: 0.71, 2: 0.70, 3: 0.70, 4: 0.72, 5: 0.71, 9: 0.5}  # seed 9 has no pair
    summary = paired.paired_summary(arm, base)
    diffs = np.array([arm[s] - base[s] for s in range(6)])
    assert summary["seeds"] == list(range(6))
    low, high = stats.t.interval(0.95, 5, loc=diffs.mean(), scale=stats.sem(diffs))
    assert summary["ci"] == pytest.approx([low, high], abs=1e-12)
    assert summary["p_wilcoxon"] == pytest.approx(stats.wilcoxon(diffs).pvalue)
    # simulated paired experiments of the MDE's true effect are significant in 80 % of the draws
    sd, n = 0.02, 6
    mde = paired.minimum_detectable_effect(sd, n)
    draws = np.random.default_rng(0).normal(mde, sd, size=(20_000, n))
    assert (stats.ttest_1samp(draws, 0.0, axis=1).pvalue < 0.05).mean() == pytest.approx(0.8, abs=0.015)
    assert paired.minimum_detectable_effect(sd, 4 * n) < mde / 1.8


def test_no_absolute_path_in_the_committed_files() -> None:
    pattern = re.compile(r"(?<![\w.~])/(?:work|home|tmp|root|Users|opt|var|mnt)/")
    offenders = [p.relative_to(REPO).as_posix() for p in EFFECT.rglob("*")
                 if p.is_file() and p.suffix in (".py", ".md", ".jsonl", ".json") and pattern.search(p.read_text())]
    assert offenders == []


def synthetic_labeled(path: Path, rows: int = 72) -> None:
    """Three classes, each with words of its own in varied sentences: learnable, not Debian."""
    rng = random.Random(0)
    vocab = {"astronomy": "telescope orbit galaxy comet planet star spectrum",
             "cooking": "recipe oven flour butter sauce simmer spice",
             "sailing": "harbour sail wind anchor keel tide rope"}
    common = ["the", "a", "tool", "for", "with", "and", "of", "data", "that", "users", "can"]
    with path.open("w") as f:
        for i in range(rows):
            label = list(vocab)[i % 3]
            words = [rng.choice(vocab[label].split() if rng.random() < 0.5 else common) for _ in range(rng.randint(8, 30))]
            f.write(json.dumps({"body": f"item {i} " + " ".join(words), "topic": label}) + "\n")


@pytest.mark.slow
def test_the_whole_harness_on_a_labeled_set_of_ones_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASKSTREAM_CACHE", str(tmp_path / "cache"))
    labeled, domain = tmp_path / "mine.jsonl", tmp_path / "domain.txt"
    synthetic_labeled(labeled)
    synthetic_labeled(tmp_path / "more.jsonl", rows=90)  # unlabeled domain text: same vocabulary, as txt
    domain.write_text("\n".join(json.loads(x)["body"] for x in (tmp_path / "more.jsonl").read_text().splitlines()))
    work, results, out = tmp_path / "work", tmp_path / "results.jsonl", tmp_path / "REPORT.md"
    common = ["--config", "tiny", "--work", str(work), "--results", str(results)]
    prepare = ["prepare", *common, "--models", str(tmp_path / "models"), "--labeled", str(labeled),
               "--text-field", "body", "--label-field", "topic", "--domain-corpus", str(domain),
               "--arms", "none,random,difference"]
    assert run.main(prepare) == 0
    prepared_bytes = (work / "tiny" / "prepared.json").read_bytes()
    assert run.main(prepare) == 0  # idempotent: every step found done, the same record
    again = json.loads((work / "tiny" / "prepared.json").read_text())
    assert {k: v for k, v in again.items() if k != "seconds"} == {
        k: v for k, v in json.loads(prepared_bytes).items() if k != "seconds"}
    prepared = json.loads((work / "tiny" / "prepared.json").read_text())

    # no validation or test text has a near-duplicate in train or either pretraining corpus (brute force)
    read = lambda name: [json.loads(x)["text"] for x in (work / "tiny" / name).read_text().splitlines()]  # noqa: E731
    held = read("labeled-validation.jsonl") + read("labeled-test.jsonl")
    assert held
    for corpus in ("labeled-train.jsonl", "tapt.jsonl", "general.jsonl"):
        assert not any(neardup.near_duplicates(h, t) for h in held for t in read(corpus)), corpus
    assert prepared["cleaning"]["tapt_removed"] > 0  # the domain file shares texts with the labeled one
    assert prepared["general_model"]["held_out"]["masked_tokens"] > 0

    with pytest.raises(SystemExit, match="pilot"):
        run.main(["run", *common, "--arms", "none,random"])
    assert run.main(["pilot", *common]) == 0
    assert run.main(["run", *common, "--arms", "none,random,difference", "--seeds", "0", "--readout", "probe"]) == 0
    assert run.main(["run", *common, "--arms", "none,random,difference", "--seeds", "0-1",  # adds seed 1
                     "--readout", "probe"]) == 0
    assert run.main(["run", *common, "--arms", "none,random", "--seeds", "0", "--readout", "finetune"]) == 0
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    kinds = [x["kind"] for x in lines]
    assert kinds.count("probe_selection") == kinds.count("pilot_choice") == 1
    pilot = [x for x in lines if x["kind"] == "pilot"]
    assert pilot and all("test" not in x["probe"] for x in pilot)  # the pilot never reads the test set
    arms = [(x["arm"], x["seed"]) for x in lines if x["kind"] == "arm"]
    assert arms == [(a, s) for s in (0, 1) for a in ("none", "random", "difference")]
    steps = {x["pretraining"]["steps"] for x in lines if x["kind"] == "arm" and x["pretraining"]}
    assert len(steps) == 1  # every arm of every seed: the same number of TAPT steps
    assert len({x["config_hash"] for x in lines if x["kind"] == "arm"}) == 1
    assert [x["arm"] for x in lines if x["kind"] == "finetune"] == ["none", "random"]
    assert run.main(["report", "--results", str(results), "--report", str(out)]) == 0
    text = out.read_text()
    assert "### 1. Positive control" in text and "Status: complete" in text  # the tiny config has seeds 0-1
    assert str(tmp_path) not in results.read_text() + text  # no path of this machine in what gets committed


TEST_LABELS = [("science", "math", "electronics")[i % 3] for i in range(90)]


def arm_line(arm: str, seed: int, correct: float) -> dict:
    """An arm's result line whose test predictions are right with probability `correct` (scored by sklearn)."""
    from sklearn.metrics import accuracy_score, f1_score

    rng = np.random.default_rng([seed, len(arm), int(1000 * correct)])
    predictions = [t if rng.random() < correct else rng.choice([x for x in set(TEST_LABELS) if x != t])
                   for t in TEST_LABELS]
    test = {"accuracy": accuracy_score(TEST_LABELS, predictions), "predictions": predictions,
            "macro_f1": f1_score(TEST_LABELS, predictions, average="macro")}
    return {"kind": "arm", "config_hash": "h", "base_hash": "b", "config_name": "cpu", "arm": arm, "seed": seed,
            "passes": 4, "probe": {"C": 1.0, "validation": {"accuracy": 0.5, "macro_f1": 0.5}, "test": test},
            "pretraining": None, "seconds": {"tapt": 1.0, "probe": 1.0, "total": 2.0},
            "hardware": {"cpu": "x", "cpu_count": 2, "torch_threads": 1}, "git_commit": "abc", "git_dirty": False,
            "versions": {"torch": "x"}, "command": "run",
            "prepared": {"general_model": {"key": "k", "shape": {"num_hidden_layers": 4, "hidden_size": 256},
                                           "parameters": 1, "settings": {"steps": 1, "batch_size": 1}, "max_length": 8,
                                           "passes": 1.0, "rows": {"train": 1}, "seconds": 1.0,
                                           "held_out": {"accuracy": 0.3, "loss": 4.0, "masked_tokens": 10},
                                           "held_out_before": {"accuracy": 0.0}},
                         "tokenizer": {"package": "p", "version": "1"},
                         "cleaning": {"threshold": 0.5, "labeled_rows": 3, "clusters": 3,
                                      "texts_in_clusters_of_2_or_more": 0, "largest_cluster": 1, "tapt_removed": 0,
                                      "general_removed": 0, "tapt_rows": 1, "general_rows": 1,
                                      "held_out_with_near_duplicate_after": {"train": 0}},
                         "counts": {"test": {"a": 1}}, "majority": {"test": 1.0}, "inputs": {}, "sha256": {},
                         "finetune_max_length": 8, "finetune_length_coverage": 0.96}}


def write_lines(tmp_path: Path, lines: list[dict]) -> str:
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(x) + "\n" for x in
                               [{"kind": "test_labels", "base_hash": "b", "labels": TEST_LABELS}, *lines]))
    report.write_report(results, tmp_path / "REPORT.md")
    return (tmp_path / "REPORT.md").read_text()


@pytest.mark.parametrize("pretraining_helps", [True, False])
def test_report_compares_arms_only_when_the_downstream_control_passes(tmp_path: Path, pretraining_helps: bool) -> None:
    lines = []
    for seed in range(8):
        lines += [arm_line("none", seed, 0.55), arm_line("random", seed, 0.75 if pretraining_helps else 0.55),
                  arm_line("difference", seed, 0.78), arm_line("background_sharpened", seed, 0.76)]
    text = write_lines(tmp_path, lines)
    if pretraining_helps:
        assert "**PASSES**" in text and "Status: complete" in text and "What the intervals cover" in text
        assert "**Primary comparison**" in text and "`difference` − `random`" in text
        row = next(x for x in text.splitlines() if x.startswith("| `difference` | primary | 8 |"))
        assert row.count("[") == 2  # the t-interval and the bootstrap interval over test texts
        assert "| `background_sharpened` | secondary | 8 |" in text
    else:
        assert "**FAILS**" in text and "compares nothing" in text and "Not compared" in text
        assert "| primary |" not in text


def test_the_gate_needs_every_planned_seed_and_a_spread(tmp_path: Path) -> None:
    few = [arm_line(arm, seed, q) for seed in range(5) for arm, q in (("none", 0.5), ("random", 0.8))]
    text = write_lines(tmp_path, few)  # a large gain, but 5 of the 8 planned seeds
    assert "**NOT DECIDED** (the gate needs every planned seed (8)" in text and "seeds [5, 6, 7] missing" in text
    assert "Not compared" in text and "compares nothing" not in text
    same = [{**arm_line(arm, seed, 0.6), "probe": arm_line(arm, 0, 0.6)["probe"]}  # every seed scores alike
            for seed in range(8) for arm in ("none", "random")]
    for line in same:
        if line["arm"] == "random":
            line["probe"] = {**line["probe"], "test": {**line["probe"]["test"],
                                                      "macro_f1": line["probe"]["test"]["macro_f1"] + 0.01}}
    assert "no spread (sd 0)" in write_lines(tmp_path, same)


def test_holm_and_the_bootstrap_over_test_texts_match_independent_computations() -> None:
    from sklearn.metrics import f1_score

    # Holm (1979): sorted p times (m - rank), made monotone, capped at 1
    assert paired.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": math.nan}) == pytest.approx(
        {"a": 0.03, "b": 0.06, "c": 0.06, "d": math.nan}, nan_ok=True)
    assert paired.holm({"a": 0.5, "b": 0.9}) == {"a": 1.0, "b": 1.0}
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 3, 60)
    predicted = np.where(rng.random(60) < 0.7, truth, rng.integers(0, 4, 60))  # class 3 only predicted
    weights = rng.multinomial(60, np.full(60, 1 / 60), 50)
    mine = paired.macro_f1_weighted(truth, predicted, weights)
    for row, value in zip(weights, mine, strict=True):
        drawn = np.repeat(np.arange(60), row)
        assert value == pytest.approx(f1_score(truth[drawn], predicted[drawn], average="macro"), abs=1e-12)
    labels = [str(t) for t in truth]
    arm = {s: [str(p) for p in predicted] for s in range(3)}
    base = {s: [str((p + s) % 3) for p in predicted] for s in range(3)}
    b = paired.bootstrap_difference(labels, arm, base, resamples=500)
    observed = np.mean([f1_score(labels, arm[s], average="macro") - f1_score(labels, base[s], average="macro")
                        for s in range(3)])
    assert b["mean"] == pytest.approx(observed) and b["ci"][0] < observed < b["ci"][1] and b["n"] == 3


def test_pilot_rule_picks_the_largest_validation_gain_ties_to_fewer_passes() -> None:
    def line(arm: str, seed: int, passes: float, accuracy: float) -> dict:
        return {"arm": arm, "seed": seed, "passes": passes, "probe": {"validation": {"macro_f1": accuracy}}}

    none = [line("none", s, 0, 0.70) for s in (100, 101)]
    gains = none + [line("random", 100, 4, 0.74), line("random", 101, 4, 0.72),
                    line("random", 100, 8, 0.745), line("random", 101, 8, 0.72)]
    assert run.pilot_choice(gains, [4, 8], [100, 101])["passes"] == 4  # 8 is within 0.5 points of the best
    clear = none + [line("random", s, 4, 0.71) for s in (100, 101)] + [line("random", s, 8, 0.75) for s in (100, 101)]
    assert run.pilot_choice(clear, [4, 8], [100, 101])["passes"] == 8
    lost = none + [line("random", s, p, 0.69) for s in (100, 101) for p in (4, 8)]
    assert run.pilot_choice(lost, [4, 8], [100, 101]) == {"passes": 8, "gains": pytest.approx({4: -0.01, 8: -0.01}),
                                                          "no_gain": True}


def test_corpora_read_every_format_and_count_what_they_reject(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.effect.corpora import read_labeled, read_texts

    labeled = tmp_path / "l.jsonl"
    labeled.write_text('{"t": "good one", "y": "a"}\n{"t": "good two", "y": 2}\nnot json\n{"t": "", "y": "a"}\n'
                       '{"t": "no label"}\n')
    rows, rejects = read_labeled(str(labeled), "t", "y")
    assert rows == [{"text": "good one", "label": "a"}, {"text": "good two", "label": "2"}] and len(rejects) == 3
    pq.write_table(pa.table({"body": ["p1", "p2"]}), tmp_path / "d.parquet")
    (tmp_path / "d.txt").write_text("t1\n\nt2\n")
    texts, rejects = read_texts([str(tmp_path / "d.*")], "body")
    assert [r["text"] for r in texts] == ["p1", "p2", "t1", "t2"] and rejects == []
    with pytest.raises(SystemExit, match="matches no file"):
        read_texts([str(tmp_path / "none*.jsonl")])

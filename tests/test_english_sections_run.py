"""Issue 76's runner (benchmarks/effect/english_sections_run.py) on made-up inputs, against ENGLISH_SECTIONS.md:
the check that the texts, clusters, folds and seed words are issue 61's; the TAPT plan and its budget cap at the
document's own figures; the default pilot's D, a, b and chosen cell; the seed plan's 16 CPU-hour budget. No
model is loaded and nothing is evaluated."""

from __future__ import annotations

import copy
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.effect import english_sections_run as run_module
from benchmarks.effect import sections_run
from benchmarks.effect.english_sections_run import (
    BUDGET_SECONDS,
    NONE_SECONDS,
    PROBE_SECONDS,
    check_model,
    default_pilot_figures,
    fold_steps,
    longest_affordable,
    round_half_up,
    run_estimate,
    same_task,
    seed_budget,
    seed_plan,
    seed_seconds,
    tapt_plan,
)
from benchmarks.effect.pilot import DEFAULT_MLM_PILOT, SEED
from maskstream.evaluate import statistics
from maskstream.evaluate.experiment import model_identity
from maskstream.models import default_mlm

# ENGLISH_SECTIONS.md's estimates, "Cost, estimated before starting"
D_ESTIMATE, A_ESTIMATE, B_ESTIMATE = 2900.0, 0.0, 1.19
ISSUE_61_ROWS = [9817, 9942]


def test_the_pins_are_the_documents() -> None:
    assert BUDGET_SECONDS == 57_600 and PROBE_SECONDS == 94.6 and NONE_SECONDS == 446.4
    # the shipped model as evaluate identifies it, recomputed from the committed folder
    assert model_identity(default_mlm()) == run_module.MODEL_IDENTITY


def test_the_run_refuses_to_start_while_the_model_identity_is_not_set(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(run_module, "MODEL_IDENTITY", None)
    with pytest.raises(SystemExit, match="MODEL_IDENTITY is not set") as refused:
        run_module.run(tmp_path)
    assert "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


def test_the_model_must_be_the_pre_registered_one_everywhere_it_is_recorded(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "english_mlm"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 256}')
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "README.md").write_text("the card is not hashed")
    monkeypatch.setattr(run_module, "default_mlm", lambda: str(folder))
    expected = model_identity(str(folder))
    assert expected["name"] == "english_mlm"
    assert check_model(expected, {"the default pilot's prepared line b1": dict(expected)}) == expected
    with pytest.raises(SystemExit, match="the default pilot's prepared line b2"):
        check_model(expected, {"the default pilot's prepared line b1": expected,
                               "the default pilot's prepared line b2": {"name": "english_mlm", "sha256": "other"}})
    (folder / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(SystemExit, match="the clone's english_mlm/"):
        check_model(expected)


# --- the same texts, clusters and folds ---------------------------------------------------------------


def seeds(words: list[str]) -> list[dict]:
    return [{"word": w, "score": 0.5 / (i + 1), "rank": i + 1} for i, w in enumerate(words)]


def prepared_line() -> dict:
    """A made-up prepared line of issue 61's shape (two folds, three labels)."""
    return {
        "kind": "prepared", "base_hash": "afbc7336e291679d",
        "versions": {"maskstream": "0.1.0", "python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0"},
        "labels": ["haskell", "python", "rust"],
        "counts": {"0": {"haskell": 2, "python": 1, "rust": 1}, "1": {"haskell": 1, "python": 2, "rust": 0}},
        "labeled": {"read": 7, "kept": 7, "rejected": 0, "file": "debian-sections.jsonl.gz"},
        "clusters": {"count": 5, "texts_in_clusters_of_2_or_more": 4, "largest": 2},
        "cleaning": {"general": {"rows": 17961, "rejected": 0, "labeled_texts_with_a_near_duplicate": 0},
                     "tapt/fold0": {"rows": 7, "removed": 4, "kept": 3, "rejected": 0},
                     "tapt/fold1": {"rows": 7, "removed": 3, "kept": 4, "rejected": 0}},
        "leaks_after_cleaning": {"tapt/fold0": 0, "tapt/fold1": 0},
        "model": {"name": "eee0451830bf05fd", "sha256": "455c0b7c"},
        "files": {"labeled": "d1a377b6", "tapt/fold0": "4f31a499", "tapt/fold1": "a851c1da"},
        "datasets": {str(f): {"main": {"seeds": seeds(words), "rows": rows, "tokens": 128 * rows,
                                       "flags": {"stats": [], "seeds": [], "build": []}}}
                     for f, words, rows in ((0, ["package", "haskell", "cargo"], 9817),
                                            (1, ["package", "python", "debcargo"], 9942))},
        "settings": {"text_field": "text", "label_field": "section", "batch_size": 32, "learning_rate": 3e-4,
                     "max_length": 128, "folds": 2, "probe_folds": 5, "device": "cpu",
                     "probe_grid": [0.01, 0.1, 1.0, 10.0], "held_out_fraction": 0.05, "eval_samples": 64},
        "truth": [["haskell", "haskell", "python", "rust"], ["haskell", "python", "python"]],
        "cluster_ids": [[0, 0, 1, 2], [3, 4, 4]],
    }


def test_a_copy_of_issue_61s_prepared_line_is_the_same_task() -> None:
    issue_61 = prepared_line()
    checked = same_task(copy.deepcopy(issue_61), issue_61)
    assert checked["equal"] and checked["unequal"] == []
    assert all(field["passes"] and field["equal"] for field in checked["fields"].values())
    assert json.loads(json.dumps(checked)) == checked  # what same_task.json holds


def test_what_differs_by_design_or_is_only_reported_leaves_the_task_the_same() -> None:
    issue_61 = prepared_line()
    ours = copy.deepcopy(issue_61)
    ours["model"] = {"name": "english_mlm", "sha256": "5a1b"}
    ours["base_hash"] = "0123456789abcdef"
    ours["cleaning"]["general"] = {"rows": 259923, "rejected": 0, "labeled_texts_with_a_near_duplicate": 0}
    ours["settings"]["learning_rate"] = 1e-4
    ours["settings"]["probe_grid"] = (0.01, 0.1, 1.0, 10.0)  # a tuple, as EvaluateConfig.deciding() gives it
    ours["versions"]["maskstream"] = "0.2.0"
    for fold in ours["datasets"].values():
        fold["main"]["rows"] += 3
        fold["main"]["tokens"] += 50
        fold["main"]["seeds"] = [{**s, "score": s["score"] * 2} for s in reversed(fold["main"]["seeds"])]
    checked = same_task(ours, issue_61)
    assert checked["equal"], checked["unequal"]
    fields = checked["fields"]
    for name in ("model", "base_hash", "cleaning.general", "settings.learning_rate", "datasets.rows",
                 "datasets.tokens"):
        assert fields[name]["passes"] and not fields[name]["equal"], name
    assert fields["datasets.rows"]["ours"] == {"0": 9820, "1": 9945}
    assert fields["datasets.rows"]["issue_61"] == {"0": 9817, "1": 9942}
    assert fields["seeds.fold0"]["equal"] and fields["seeds.fold0"]["words"] == 3


def change(line: dict, what: str) -> None:
    if what == "truth":
        line["truth"][1][2] = "rust"
    elif what == "cluster_ids":
        line["cluster_ids"][0] = [0, 1, 1, 2]
    elif what == "seed word":
        line["datasets"]["1"]["main"]["seeds"][2]["word"] = "rust"
    elif what == "files":
        line["files"]["tapt/fold1"] = "0000"
    elif what == "a fourth file":
        line["files"]["background/fold0"] = "1111"
    elif what == "counts":
        line["counts"]["1"]["rust"] = 1
    elif what == "cleaning of a fold":
        line["cleaning"]["tapt/fold0"]["removed"] = 5
    elif what == "a near-duplicate in the general corpus":
        line["cleaning"]["general"]["labeled_texts_with_a_near_duplicate"] = 2
    elif what == "no general corpus":
        line["cleaning"]["general"] = "not given: the model's pretraining text was not checked"
    elif what == "batch size":
        line["settings"]["batch_size"] = 16
    elif what == "torch":
        line["versions"]["torch"] = "2.14.0+cpu"


@pytest.mark.parametrize("what, field", [
    ("truth", "truth"), ("cluster_ids", "cluster_ids"), ("seed word", "seeds.fold1"), ("files", "files"),
    ("a fourth file", "files"), ("counts", "counts"), ("cleaning of a fold", "cleaning.tapt/fold0"),
    ("a near-duplicate in the general corpus", "cleaning.general"), ("no general corpus", "cleaning.general"),
    ("batch size", "settings (but learning_rate)"), ("torch", "versions (but maskstream)")])
def test_a_different_field_is_named(what: str, field: str) -> None:
    issue_61 = prepared_line()
    ours = copy.deepcopy(issue_61)
    change(ours, what)
    checked = same_task(ours, issue_61)
    assert not checked["equal"] and checked["unequal"] == [field]
    assert not checked["fields"][field]["passes"]
    if what == "truth":
        assert checked["fields"]["truth"]["first_difference"] == [1, 2]
    if what == "seed word":
        assert checked["fields"]["seeds.fold1"]["only_ours"] == ["rust"]
        assert checked["fields"]["seeds.fold1"]["only_issue_61"] == ["debcargo"]
    # the check is symmetric in what it refuses
    assert same_task(issue_61, ours)["unequal"] == [field]


# --- TAPT length and learning rate ----------------------------------------------------------------------


@pytest.mark.parametrize("passes, fold0, fold1, steps, seed_cost, estimate, minutes, afford", [
    (1, 307, 311, 309, 1849, 16737, 6, 27), (2, 614, 622, 618, 3320, 27033, 12, 14),
    (4, 1228, 1243, 1236, 6262, 47625, 25, 6)])
def test_issue_61s_rows_give_the_documents_steps_and_costs(passes, fold0, fold1, steps, seed_cost, estimate, minutes,
                                                           afford) -> None:
    plan = tapt_plan(ISSUE_61_ROWS, passes, 1e-4, D_ESTIMATE, A_ESTIMATE, B_ESTIMATE, PROBE_SECONDS, NONE_SECONDS)
    assert plan["steps_at_passes"] == [fold0, fold1] and plan["steps_by_rule"] == steps
    assert not plan["cut"] and plan["steps"] == steps
    assert round(plan["seed_seconds"]) == seed_cost and round(plan["estimate"]) == estimate
    assert plan["estimate"] == plan["estimate_at_rule"]
    assert round(B_ESTIMATE * steps / 60) == minutes
    # the table's last column: N_afford at these estimates (the pilot: `none` and 2 seeds)
    c = plan["seed_seconds"]
    assert seed_budget(2, D_ESTIMATE, NONE_SECONDS + 2 * c, NONE_SECONDS, c)["affordable_seeds"] == afford


def test_eight_passes_are_cut_to_what_the_budget_affords_at_five_seeds() -> None:
    plan = tapt_plan(ISSUE_61_ROWS, 8, 3e-4, D_ESTIMATE, A_ESTIMATE, B_ESTIMATE, PROBE_SECONDS, NONE_SECONDS)
    assert plan["steps_at_passes"] == [2455, 2486] and plan["steps_by_rule"] == 2471
    assert round(plan["estimate_at_rule"]) == 88775  # 24.7 CPU-hours
    assert plan["cut"] and plan["steps"] == plan["steps_max"] == 1535
    assert round(plan["seed_seconds"]) == 7685 and round(plan["estimate"]) == 57588
    assert plan["estimate"] <= BUDGET_SECONDS < run_estimate(1536, 5, D_ESTIMATE, 0, B_ESTIMATE, PROBE_SECONDS,
                                                             NONE_SECONDS)
    assert round(B_ESTIMATE * plan["steps"] / 60) == 30
    c = plan["seed_seconds"]
    assert seed_budget(2, D_ESTIMATE, NONE_SECONDS + 2 * c, NONE_SECONDS, c)["affordable_seeds"] == 5
    # the document's S_max, with D + 2 n0 rounded to 3,793 as it writes it
    assert math.floor(((57600 - 3793) / 28 - 94.6) / 1.19) == 1535
    assert plan["learning_rate"] == 3e-4 and plan["passes"] == 8 and plan["rows"] == ISSUE_61_ROWS
    for key in ("D", "a", "b", "p", "n0"):
        assert key in plan


def test_issue_61s_length_for_comparison() -> None:
    assert round(seed_seconds(1350, A_ESTIMATE, B_ESTIMATE, PROBE_SECONDS)) == 6804
    assert round(run_estimate(1350, 5, D_ESTIMATE, A_ESTIMATE, B_ESTIMATE, PROBE_SECONDS, NONE_SECONDS)) == 51424
    c = seed_seconds(1350, A_ESTIMATE, B_ESTIMATE, PROBE_SECONDS)
    assert seed_budget(2, D_ESTIMATE, NONE_SECONDS + 2 * c, NONE_SECONDS, c)["affordable_seeds"] == 5


def test_a_budget_nothing_fits_is_refused() -> None:
    with pytest.raises(SystemExit, match="no TAPT length fits"):
        tapt_plan(ISSUE_61_ROWS, 8, 3e-4, 56000.0, 0.0, B_ESTIMATE, PROBE_SECONDS, NONE_SECONDS)


@settings(deadline=None, max_examples=200)
@given(rows=st.lists(st.integers(1, 60_000), min_size=1, max_size=4),
       quarters=st.integers(1, 64))
def test_s_is_the_mean_of_evaluates_steps_a_fold_rounded_half_up(rows: list[int], quarters: int) -> None:
    passes = quarters / 4
    plan = tapt_plan(rows, passes, 1e-4, 0.0, 0.0, 1e-9, 0.0, 0.0, budget_seconds=1e12)
    per_fold = [max(1, math.ceil(passes * r / 32)) for r in rows]  # evaluate's Evaluation.tapt_steps
    assert plan["steps_at_passes"] == per_fold == [fold_steps(r, passes) for r in rows]
    mean = Fraction(sum(per_fold), len(per_fold))
    assert plan["steps_by_rule"] == plan["steps"] == round_half_up(mean) and not plan["cut"]
    assert abs(plan["steps"] - mean) <= Fraction(1, 2)
    # what the document says of it: round(P x mean of rows / 32), up to one step (evaluate rounds each fold up)
    assert 0 <= plan["steps"] - round_half_up(Fraction(quarters, 4) * Fraction(sum(rows), len(rows)) / 32) <= 1


@settings(deadline=None, max_examples=200)
@given(D=st.floats(0, 20_000), a=st.floats(0, 60), b=st.floats(0.05, 5), p=st.floats(0, 300), n0=st.floats(0, 2000),
       passes=st.sampled_from([1, 2, 4, 8, 16]))
def test_the_cap_is_the_most_steps_that_fit_at_five_seeds(D, a, b, p, n0, passes) -> None:
    most = longest_affordable(D, a, b, p, n0)
    if most is None or most < 1:
        return
    plan = tapt_plan(ISSUE_61_ROWS, passes, 1e-4, D, a, b, p, n0)
    fits = run_estimate(plan["steps_by_rule"], 5, D, a, b, p, n0) <= BUDGET_SECONDS
    assert plan["cut"] == (not fits)
    assert plan["steps"] == (plan["steps_by_rule"] if fits else most)
    assert plan["estimate"] <= BUDGET_SECONDS * (1 + 1e-12)
    if plan["cut"]:
        assert run_estimate(plan["steps"] + 1, 5, D, a, b, p, n0) > BUDGET_SECONDS * (1 - 1e-12)


# --- the default pilot's figures --------------------------------------------------------------------------


def default_pilot(path: Path, a: float, b: float, rows: tuple[int, int] = (1000, 1100), drop: int | None = None,
                  gain: dict[int, float] | None = None) -> list[dict]:
    """A made-up results.jsonl of the default pilot: both learning rates prepared, `none` once for each, one
    `random` line a cell whose folds' TAPT seconds are a + b x steps."""
    model = {"name": "english_mlm", "sha256": "5a1b"}
    lines: list[dict] = [{"kind": "prepared", "base_hash": f"b{lr}", "model": model, "settings": {"learning_rate": lr}}
                         for lr in (1e-4, 3e-4)]
    for lr in (1e-4, 3e-4):
        lines.append({"kind": "arm", "base_hash": f"b{lr}", "config_hash": f"none{lr}", "arm": "none", "seed": None,
                      "passes": 0.0, "macro_f1": 0.5,
                      "folds": [{"pretraining": None, "seconds": {"tapt": 0.01, "probe": 30.0}}] * 2})
    for cell in DEFAULT_MLM_PILOT.grid:
        if cell.number == drop:
            continue
        steps = [max(1, math.ceil(cell.passes * r / 32)) for r in rows]
        lines.append({"kind": "arm", "base_hash": f"b{cell.learning_rate}", "config_hash": f"c{cell.number}",
                      "arm": "random", "seed": SEED, "passes": cell.passes,
                      "macro_f1": 0.5 + (gain or {}).get(cell.number, 0.0) / 100,
                      "folds": [{"pretraining": {"steps": s}, "seconds": {"tapt": a + b * s, "probe": 10.0}}
                                for s in steps]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def test_the_default_pilot_gives_d_the_fit_and_the_chosen_cell(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    lines = default_pilot(results, a=5.0, b=0.5, gain={1: 0.5, 2: 1.5, 3: 2.0, 4: 3.0})
    figures = default_pilot_figures(results)
    assert figures["a"] == pytest.approx(5.0) and figures["b"] == pytest.approx(0.5)
    assert figures["arm_lines"] == 10 and figures["random_lines"] == 8 and figures["fit_folds"] == 16
    assert figures["D"] == pytest.approx(sum(f["seconds"]["tapt"] + f["seconds"]["probe"]
                                             for r in lines if r["kind"] == "arm" for f in r["folds"]))
    # DEFAULT_PILOT.md's rule 3: the passing cell within the ceiling with the fewest passes, then the larger gain
    assert figures["cell"] == {"number": 2, "rule": 3, "verdict": figures["cell"]["verdict"], "passes": 1,
                               "learning_rate": 3e-4}
    assert figures["models"] == {"b0.0001": lines[0]["model"], "b0.0003": lines[1]["model"]}


def test_the_fit_keeps_its_intercept_at_least_zero(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    lines = default_pilot(results, a=-40.0, b=1.2)
    figures = default_pilot_figures(results)
    steps = np.array([f["pretraining"]["steps"] for r in lines if r.get("arm") == "random" for f in r["folds"]])
    seconds = -40.0 + 1.2 * steps
    assert figures["free_intercept"] == pytest.approx(-40.0)
    assert figures["a"] == 0.0 and figures["b"] == pytest.approx(steps @ seconds / (steps @ steps))


def test_an_unfinished_default_pilot_is_refused(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    default_pilot(results, a=5.0, b=0.5, drop=8)
    with pytest.raises(SystemExit, match="7 of 8 cells"):
        default_pilot_figures(results)


# --- the seed plan ----------------------------------------------------------------------------------------


def test_the_budget_counts_the_default_pilot_and_the_floor_of_five_stands_over_it() -> None:
    c = 7685.0  # a seed at the document's estimates, S = 1,535
    spent, none = NONE_SECONDS + 2 * c, NONE_SECONDS
    fits = seed_budget(2, D_ESTIMATE, spent, none, c)
    assert fits["affordable_seeds"] == 5 and fits["seeds"] == 5 and fits["fits_budget"]
    assert fits["estimated_seconds"] == pytest.approx(D_ESTIMATE + spent + none + 5 * c) and fits["overrun_seconds"] == 0
    # the same pilot after a costlier default pilot: D counts, and 5 seeds no longer fit
    late = seed_budget(2, 8000.0, spent, none, c)
    assert late["affordable_seeds"] == 4 and late["seeds"] == 5 and not late["fits_budget"]
    assert late["overrun_seconds"] == pytest.approx(8000 + spent + none + 5 * c - 57_600)
    costly = seed_budget(2, D_ESTIMATE, NONE_SECONDS + 2 * 10_000, NONE_SECONDS, 10_000.0)
    assert costly["affordable_seeds"] == 3 and costly["seeds"] == 5 and not costly["fits_budget"]
    assert costly["overrun_seconds"] == pytest.approx(D_ESTIMATE + 20_446.4 + 446.4 + 50_000 - 57_600)
    cheap = 500.0
    assert seed_budget(None, D_ESTIMATE, 2 * cheap, 100.0, cheap)["seeds"] == 24  # no number of seeds reaches it
    assert seed_budget(9, D_ESTIMATE, 2 * cheap, 100.0, cheap)["seeds"] == 9
    assert seed_budget(3, D_ESTIMATE, 2 * cheap, 100.0, cheap)["seeds"] == 5
    assert seed_budget(9, 55_000.0, 2 * cheap, 100.0, cheap)["seeds"] == 5  # 3 afforded, 9 needed


def test_the_seed_plan_reads_the_pilot_as_issue_61s_rule_does_with_this_budget(tmp_path: Path, monkeypatch) -> None:
    rng = np.random.default_rng(3)
    labels = ["a", "b", "c"]
    truth = [rng.choice(labels, 90).tolist(), rng.choice(labels, 80).tolist()]
    clusters = [rng.integers(0, 60, 90).tolist(), rng.integers(100, 150, 80).tolist()]

    def line(arm: str, seed: int | None, right: float, chash: str, seconds: float) -> dict:
        folds = [{"fold": f, "predictions": [y if rng.random() < right else "a" for y in truth[f]],
                  "seconds": {"tapt": seconds, "probe": 10.0}} for f in (0, 1)]
        return {"kind": "arm", "base_hash": "b", "config_hash": chash, "arm": arm, "seed": seed,
                "macro_f1": right, "folds": folds}

    def plan_for(tapt_seconds: float, D: float) -> dict:
        lines = [{"kind": "prepared", "base_hash": "b", "labels": labels, "truth": truth, "cluster_ids": clusters},
                 line("none", None, 0.5, "c0", 0.0)]
        lines += [line(arm, seed, right, "c1", tapt_seconds) for seed in (2000, 2001)
                  for arm, right in (("random", 0.7), ("difference", 0.72))]
        (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        return seed_plan(tmp_path, D)

    plan = plan_for(100.0, 2900.0)
    issue_61 = sections_run.seed_plan(tmp_path)
    for key in ("pilot_seeds", "texts", "components", "seeds_for_power", "seconds_per_seed", "pilot_seconds"):
        assert plan[key] == issue_61[key], key
    per_seed = 2 * (2 * 100.0 + 2 * 10.0)
    spent, none = 2 * per_seed + 20.0, 20.0
    assert plan["affordable_seeds"] == math.floor((57_600 - 2900 - spent - none) / per_seed)
    assert plan["default_pilot_seconds"] == 2900.0 and plan["budget_seconds"] == 57_600 and plan["fits_budget"]
    assert plan["seeds"] == max(5, min(plan["seeds_for_power"] or 24, plan["affordable_seeds"], 24))
    assert plan["power_at_margin"] == pytest.approx(statistics.hierarchical_power(0.01, statistics.projected_variance(
        plan["components"], 2, 170, plan["seeds"], 170)))
    # a pilot 5 seeds of which overrun the budget: N stays 5, and the plan says so
    monkeypatch.setattr(sections_run, "design_for_power", lambda *args: {"seeds": 20, "texts": None})
    costly = plan_for(6000.0, 2900.0)
    per_seed = 2 * (2 * 6000.0 + 2 * 10.0)
    assert costly["affordable_seeds"] == 0 and costly["seeds"] == 5 and not costly["fits_budget"]
    assert costly["overrun_seconds"] == pytest.approx(2900 + 2 * per_seed + 20 + 20 + 5 * per_seed - 57_600)

"""The effect experiment (benchmarks/effect): the dedupe of the pretraining corpus, the seed-level
statistics against scipy, and the whole experiment (prepare, run, report) on its tiny config."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EFFECT = REPO / "benchmarks/effect"


def load(name: str):
    sys.path.insert(0, str(EFFECT))
    spec = importlib.util.spec_from_file_location(f"effect_{name}", EFFECT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"effect_{name}"] = module
    spec.loader.exec_module(module)
    return module


def test_dedupe_removes_every_pretraining_text_that_validation_or_test_holds() -> None:
    run = load("run")
    held = [{"text": "Tools for  Gene\tAlignment"}, {"text": "ﬁnite element solver"}]  # ligature: NFKC "fi"
    corpus = [{"text": "tools for gene alignment"}, {"text": "  TOOLS FOR GENE ALIGNMENT "},
              {"text": "finite element solver"}, {"text": "finite element solvers"}, {"text": "a circuit simulator"},
              *held]
    kept, removed = run.dedupe(corpus, held)
    assert [r["text"] for r in kept] == ["finite element solvers", "a circuit simulator"]
    assert removed == 5
    assert run.dedupe(corpus, []) == (corpus, 0)


def test_paired_statistics_match_scipy_and_simulation() -> None:
    from scipy import stats

    paired = load("paired")
    arm = {0: 0.71, 1: 0.74, 2: 0.69, 3: 0.73, 4: 0.75, 5: 0.70}
    base = {0: 0.70, 1: 0.71, 2: 0.70, 3: 0.70, 4: 0.72, 5: 0.71, 9: 0.5}  # seed 9 has no pair
    summary = paired.paired_summary(arm, base)
    diffs = np.array([arm[s] - base[s] for s in range(6)])
    assert summary["seeds"] == list(range(6))
    low, high = stats.t.interval(0.95, 5, loc=diffs.mean(), scale=stats.sem(diffs))
    assert summary["ci"] == pytest.approx([low, high], abs=1e-12)
    assert summary["p_t"] == pytest.approx(stats.ttest_rel([arm[s] for s in range(6)],
                                                           [base[s] for s in range(6)]).pvalue)
    assert summary["p_wilcoxon"] == pytest.approx(stats.wilcoxon(diffs).pvalue)

    # The minimum detectable effect: simulated paired experiments of that true effect are found
    # significant by scipy's paired t-test in 80% of the draws.
    sd, n = 0.02, 6
    mde = paired.minimum_detectable_effect(sd, n)
    rng = np.random.default_rng(0)
    draws = rng.normal(mde, sd, size=(20_000, n))
    found = (stats.ttest_1samp(draws, 0.0, axis=1).pvalue < 0.05).mean()
    assert found == pytest.approx(0.8, abs=0.015)
    assert paired.minimum_detectable_effect(sd, 4 * n) < mde / 1.8  # four times the seeds, about half
    assert np.isnan(paired.paired_summary({0: 0.7}, {0: 0.6})["ci"][0])


@pytest.mark.slow
def test_whole_experiment_on_the_tiny_config(tmp_path: Path) -> None:
    run = load("run")
    work, results, report = tmp_path / "work", tmp_path / "results.jsonl", tmp_path / "REPORT.md"
    common = ["--config", "tiny", "--work", str(work)]
    assert run.main(["prepare", *common, "--results", str(results)]) == 0
    prepared = json.loads((work / "tiny" / "prepared.json").read_text())

    # the pretraining corpus holds no validation or test text, and the removed count is exact
    read = lambda name: [json.loads(x) for x in Path(prepared["paths"][name]).read_text().splitlines()]  # noqa: E731
    held = {run.normalize(r["text"]) for r in read("validation") + read("test")}
    domain = read("domain")
    assert held and not any(run.normalize(r["text"]) in held for r in domain)
    assert prepared["dedupe_removed"] == prepared["rows"] - len(domain) > 0

    assert run.main(["run", *common, "--seeds", "0", "--results", str(results)]) == 0
    assert run.main(["run", *common, "--seeds", "0-1", "--results", str(results)]) == 0  # adds seed 1 only
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert [x["kind"] for x in lines].count("selection") == 1
    arms = [(x["arm"], x["seed"]) for x in lines if x["kind"] == "arm"]
    assert arms == [(a, s) for s in (0, 1) for a in run.DEFAULT_ARMS]
    test_rows = len(read("test"))
    for line in lines[1:]:
        assert len(line["test"]["predictions"]) == line["test"]["examples"] == test_rows
        assert line["config_hash"] == lines[0]["config_hash"] and line["git_commit"]
        assert line["finetune"]["learning_rate"] == lines[0]["chosen"]["learning_rate"]
        intrinsic = line["intrinsic"]
        assert intrinsic["random"] > 0 and intrinsic["tokens"]["random"] == (
            intrinsic["tokens"]["random_seed_similar"] + intrinsic["tokens"]["random_rest"])
        assert (intrinsic["own"] is None) == (line["arm"] == "none")
        if line["arm"] != "none":
            assert line["pretraining"]["steps"] == run.CONFIGS["tiny"]["train"]["steps"]
    # the `none` arm is the warmed checkpoint itself: the same held-out loss for every seed
    assert len({x["intrinsic"]["random"] for x in lines if x.get("arm") == "none"}) == 1

    assert run.main(["report", "--results", str(results), "--report", str(report)]) == 0
    text = report.read_text()
    order = [text.index(s) for s in ("### 1. Positive control", "### 2. Power", "### 3. Paired results",
                                     "### 4. Held-out MLM loss", "### 5. What this can and cannot conclude",
                                     "### Provenance")]
    assert order == sorted(order)
    assert prepared["warm"]["sha256"][:16] in text and prepared["sha256"]["corpus"][:16] in text
    for png in tmp_path.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # mask probabilities and their signal (inspect), downstream, held-out losses
    assert len(list(tmp_path.glob("*.png"))) == 4
    assert "mask_probabilities-tiny_signal.png" in text


def synthetic_line(arm: str, seed: int, accuracy: float, mlm: float) -> dict:
    """A results line as `run.py run` writes it, with chosen numbers."""
    pretraining = None if arm == "none" else {
        "steps": 40, "config": {"total_steps": 40, "batch_size": 16, "learning_rate": 2e-4, "warmup_steps": 3},
        "curves": [{"step": 0, "split": "held_out", "loss": 3.0}, {"step": 40, "split": "held_out", "loss": mlm}]}
    return {
        "kind": "arm", "config_hash": "h", "config_name": "cpu", "arm": arm, "seed": seed, "pretraining": pretraining,
        "test": {"accuracy": accuracy, "macro_f1": accuracy - 0.2, "examples": 4, "predictions": [0, 1, 2, 0]},
        "validation": {"accuracy": 0.7, "macro_f1": 0.5}, "best_epoch": 1,
        "intrinsic": {"definition": "d", "random": mlm, "own": None if arm == "none" else mlm,
                      "random_seed_similar": mlm + 0.5, "random_rest": mlm - 0.1},
        "finetune": {"learning_rate": 1e-4, "tmr": 0.1}, "seconds": {"finetune": 1.0, "total": 2.0},
        "prepared": {"majority": {"test": 0.7}, "labels": ["a", "b", "c"], "counts": {"test": {"a": 3, "b": 1}},
                     "model": "/x/minilm/model", "domain_rows": 10, "dedupe_removed": 2, "sha256": {"corpus": "c" * 64},
                     "warm_sha256": "w" * 64, "datasets": {"main": {"seeds.json": "s" * 64}},
                     "seconds": {"total": 60.0}, "command": "prepare"},
        "command": "run", "git_commit": "abc", "git_dirty": False, "versions": {"torch": "x"}, "hardware": {"cpu": "y"},
    }


@pytest.mark.parametrize("pretraining_helps", [True, False])
def test_report_states_the_control_first_and_claims_nothing_when_it_fails(tmp_path: Path,
                                                                         pretraining_helps: bool) -> None:
    report_module = load("report")
    rng = np.random.default_rng(1)
    lines = []
    for seed in range(5):
        noise = rng.normal(0, 0.01)
        lines += [synthetic_line("none", seed, 0.70, 3.0),
                  synthetic_line("random", seed, 0.72 + noise, (2.5 if pretraining_helps else 3.0) + noise),
                  synthetic_line("difference", seed, 0.74 + noise + rng.normal(0, 0.002), 2.6 + noise)]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report_module.write_report(results, tmp_path / "REPORT.md")
    text = (tmp_path / "REPORT.md").read_text()
    assert text.index("### 1. Positive control") < text.index("### 2. Power") < text.index("### 3. Paired")
    differences = [lines[3 * s + 2]["test"]["accuracy"] - lines[3 * s + 1]["test"]["accuracy"] for s in range(5)]
    mean = 100 * float(np.mean(differences))
    if pretraining_helps:
        assert "MLM loss (common random masking): PASSES" in text
        assert f"Difference masking beats random masking downstream: Δ {mean:+.2f} points" in text
    else:
        assert "FAILS" in text and "the experiment is underpowered" in text
        assert "no conclusion about difference vs random masking is drawn" in text
        assert "Difference masking beats" not in text

"""The effect experiment (benchmarks/effect) end to end on its tiny configuration: every arm,
one seed, a few steps each, the ablation, and the generated report."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_runner():
    spec = importlib.util.spec_from_file_location("effect_run", REPO / "benchmarks/effect/run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["effect_run"] = module
    spec.loader.exec_module(module)
    return module


def test_effect_tiny_end_to_end(tmp_path: Path) -> None:
    run = load_runner()
    results, report = tmp_path / "results", tmp_path / "REPORT.md"
    argv = ["--config", "tiny", "--out", str(results), "--work", str(tmp_path / "work"), "--report", str(report)]
    assert run.main(argv) == 0

    config = run.CONFIGS["tiny"]
    arms = ["none", *run.PRETRAIN_ARMS, *(f"difference[{name}]" for name in config["ablations"])]
    data = json.loads((results / "data.json").read_text())
    for arm in arms:
        record = json.loads((results / "runs" / arm / "seed0" / "finetune-tmr0.1.json").read_text())
        test = record["evaluation"]["test"]
        assert 0 <= test["accuracy"] <= 1 and 0 <= test["macro_f1"] <= 1
        assert len(test["predictions"]) == len(data["test_label_ids"]) == test["examples"]
        assert sum(map(sum, test["confusion_matrix"])) == test["examples"]
        if arm != "none":
            pretrain = json.loads((results / "runs" / arm / "seed0" / "pretrain.json").read_text())
            assert pretrain["steps"] == config["train"]["steps"] and pretrain["held_out"]["perplexity"] > 1
    expected_strategies = {"random": ("random", False), "whole_word": ("whole_word", False),
                           "difference": ("difference", False), "difference_ww": ("difference", True)}
    for arm, (strategy, whole_word) in expected_strategies.items():
        pretrain_config = json.loads((results / "runs" / arm / "seed0" / "pretrain.json").read_text())["config"]
        assert (pretrain_config["strategy"], pretrain_config["whole_word"]) == (strategy, whole_word)
    main_dataset = json.loads((results / "datasets" / "main.json").read_text())
    assert len(main_dataset["seeds"]) == 20
    analysis = main_dataset["mask_analysis"]
    assert abs(analysis["mean"] - 0.15) < 0.02  # the stored probabilities sum to the budget per sequence
    assert 0 < analysis["share_on_seed_words"] <= 1 and analysis["top_words"]

    text = report.read_text()
    for arm in arms:
        assert f"| {arm} | 0.1 |" in text
    assert "None: every planned arm" in text and "Where `difference` puts the masks" in text
    for png in ("accuracy.png", "loss_curves.png", "mask_probabilities-main.png"):
        assert (results / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"results/{png}" in text

    # a second run skips every finished run; --report-only regenerates the same report
    stamps = {p: p.stat().st_mtime_ns for p in (results / "runs").rglob("*.json")}
    assert run.main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in (results / "runs").rglob("*.json")} == stamps
    assert len(json.loads((results / "run.json").read_text())["sessions"]) == 2
    text = report.read_text()
    assert run.main([*argv, "--report-only"]) == 0
    assert report.read_text() == text

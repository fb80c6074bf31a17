"""`maskstream train --objective exlm`: the ExLM loss trains through the real loop, held-out metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM

from maskstream.cli import main
from maskstream.trainer.metrics import read_metrics
from testing.sequence_dataset import read_texts, sequence_rows, write_dataset


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("exlm-dataset")
    write_dataset(str(root), sequence_rows(read_texts(limit=80), max_length=48), shards=2, row_group_size=20)
    return str(root)



def _run(dataset: str, model: str, out, *extra: str) -> list[dict]:
    args = ["train", "--dataset", dataset, "--output", str(out), "--model", model, "--objective", "exlm",
            "--batch-size", "8", "--max-steps", "10", "--warmup-ratio", "0", "--learning-rate", "1e-2",
            "--held-out-fraction", "0.1", "--eval-samples", "8", "--eval-every", "100", "--log-every", "1",
            "--num-workers", "0", "--strategy", "random", *extra]
    assert main(args) == 0
    return read_metrics(out)


@pytest.mark.slow
def test_exlm_objective_trains_and_reports_held_out_perplexity_and_accuracy(small_dataset, tiny_bert, tmp_path):
    records = _run(small_dataset, tiny_bert, tmp_path / "run", "--exlm-states", "2")
    held = [r for r in records if r["split"] == "held_out"]
    assert [r["step"] for r in held] == [0, 10] and held[0]["masked_tokens"] == held[1]["masked_tokens"] > 0
    assert held[1]["loss"] < held[0]["loss"] - 1.0, held
    assert held[1]["perplexity"] == pytest.approx(np.exp(held[1]["loss"]))
    assert 0 <= held[1]["accuracy"] <= 1
    train = [r for r in records if r["split"] == "train"]
    assert len(train) == 10 and np.mean([r["loss"] for r in train[-3:]]) < np.mean([r["loss"] for r in train[:3]]) - 0.5
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["objective"] == "exlm" and summary["config"]["exlm_states"] == 2
    # The checkpoint holds the ExLM parts beside a from_pretrained folder of the masked LM;
    # model/ is the plain masked LM for fine-tuning.
    checkpoint = next((tmp_path / "run" / "checkpoints").glob("step-*"))
    names = set(load_file(checkpoint / "objective.safetensors"))
    assert "copy_embedding.weight" in names and "transitions.query.weight" in names
    assert not any(name.startswith("mlm.") for name in names)
    _, info = AutoModelForMaskedLM.from_pretrained(checkpoint, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert (tmp_path / "run" / "model" / "config.json").exists()


@pytest.mark.slow
def test_token_budget_runs_the_same_objective_in_chunks(small_dataset, tiny_bert, tmp_path):
    whole = _run(small_dataset, tiny_bert, tmp_path / "whole", "--max-steps", "2")
    chunked = _run(small_dataset, tiny_bert, tmp_path / "chunked", "--max-steps", "2", "--exlm-token-budget", "150")
    assert [(r["split"], r["step"]) for r in whole] == [(r["split"], r["step"]) for r in chunked]
    # Before training, in eval mode: the same numbers. In training, dropout draws differ per chunk shape.
    assert chunked[0]["split"] == "held_out" and chunked[0]["loss"] == pytest.approx(whole[0]["loss"], rel=1e-5)
    assert chunked[0]["accuracy"] == whole[0]["accuracy"]
    for a, b in zip(whole[1:], chunked[1:], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-2)

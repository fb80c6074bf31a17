"""Masking-budget schedules (`--mask-budget-schedule`, issue 41 item 3): the budget each step draws,
every strategy following it, difference masking's exact budget, the logged budget and an exact resume."""

from __future__ import annotations

import dataclasses
import math
import shutil

import pytest
import torch

from maskstream.cli import main
from maskstream.mask_signal.probability import scale_to_budget
from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.masking import (
    BudgetSchedule,
    MaskingConfig,
    apply_masking,
    budget_counts,
    difference_weights,
    maskable,
)
from maskstream.trainer.metrics import read_metrics
from testing.sequence_dataset import read_texts, sequence_rows, tokenizer, write_dataset


def test_schedules_go_from_start_to_end_over_the_run():
    linear = BudgetSchedule.parse("linear:0.3:0.15")
    assert [round(linear.at(s, 11), 6) for s in (0, 5, 10)] == [0.3, 0.225, 0.15]
    cosine = BudgetSchedule.parse("cosine:0.3:0.15")
    assert cosine.at(0, 11) == pytest.approx(0.3) and cosine.at(10, 11) == pytest.approx(0.15)
    assert cosine.at(5, 11) == pytest.approx(0.225)  # half way: the mean
    assert cosine.at(2, 11) > linear.at(2, 11)  # cosine stays high longer
    constant = BudgetSchedule.parse("constant", 0.2)
    assert {constant.at(s, 7) for s in range(7)} == {0.2}
    assert linear.at(99, 11) == pytest.approx(0.15) and linear.at(0, 1) == pytest.approx(0.3)
    for bad in ("linear", "linear:0.3", "linear:0.3:0", "step:0.3:0.1", "cosine:a:b", "constant:0.2:0.2"):
        with pytest.raises(ValueError, match="mask-budget-schedule"):
            BudgetSchedule.parse(bad)


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    """64 real sequences of up to 128 tokens, with stored probabilities that vary by token."""
    rows = sequence_rows(read_texts(limit=64), max_length=128)
    samples = [{**{k: torch.as_tensor(r[k]).numpy() for k in ("input_ids", "word_ids", "special_tokens_mask",
                                                              "mask_probability")}, "sample_index": i}
               for i, r in enumerate(rows)]
    return collate_sequences(samples, tokenizer().pad_token_id)


@pytest.mark.parametrize("budget", [0.3, 0.2625, 0.225, 0.15])
def test_every_strategy_draws_the_steps_budget(batch, budget):
    config = dataclasses.replace(MaskingConfig.from_tokenizer(tokenizer()), budget=budget)
    can_mask = maskable(batch)
    tokens = can_mask.sum(dim=1)
    count = budget_counts(can_mask, budget)
    assert torch.equal(count, torch.round(tokens.double() * budget).long())
    # difference: the inclusion probabilities (the exact-budget rule) sum to the step's budget, and
    # exactly that many tokens are masked in every sequence.
    inclusion = scale_to_budget(difference_weights(batch, can_mask), can_mask, count)
    assert float((inclusion.sum(dim=1) - count).abs().max()) < 1e-6 and float(inclusion.max()) <= 1.0
    chosen = {}
    for strategy in ("difference", "random", "whole_word", "span"):
        masked = apply_masking(batch, strategy, config, seed=0, epoch=0)["labels"] != -100
        chosen[strategy] = masked.sum(dim=1)
    assert torch.equal(chosen["difference"], count)
    assert bool((chosen["whole_word"] >= count).all()) and bool((chosen["span"] <= count).all())
    assert float(chosen["span"].sum()) >= 0.9 * float(count.sum())
    share = float(chosen["random"].sum()) / float(tokens.sum())  # Bernoulli(budget) per token
    assert abs(share - budget) < 4 * math.sqrt(budget * (1 - budget) / float(tokens.sum()))


@pytest.mark.slow
def test_a_scheduled_run_logs_each_steps_budget_and_resumes_exactly(tmp_path_factory, tiny_bert):
    root = tmp_path_factory.mktemp("dataset")
    write_dataset(str(root), sequence_rows(read_texts(limit=120), max_length=64), shards=3, row_group_size=20)
    args = ["--dataset", str(root), "--model", tiny_bert, "--log-every", "1", "--batch-size", "8",
            "--max-steps", "10", "--save-every", "5", "--num-workers", "2", "--learning-rate", "1e-3",
            "--eval-samples", "8", "--eval-every", "1000", "--mask-budget-schedule", "linear:0.3:0.15"]
    out = tmp_path_factory.mktemp("run")
    assert main(["train", "--output", str(out / "a"), *args]) == 0
    records = {r["step"]: r for r in read_metrics(out / "a") if r["split"] == "train"}
    schedule = BudgetSchedule.parse("linear:0.3:0.15")
    assert [records[s]["mask_budget"] for s in range(1, 11)] == pytest.approx([schedule.at(s, 10) for s in range(10)])

    resumed = out / "b"
    shutil.copytree(out / "a" / "checkpoints" / "step-00000005", resumed / "checkpoints" / "step-00000005")
    (resumed / "checkpoints" / "latest").write_text("step-00000005\n")
    assert main(["train", "--output", str(resumed), *args, "--resume"]) == 0
    again = {r["step"]: r for r in read_metrics(resumed) if r["split"] == "train"}
    assert [again[s]["loss"] for s in range(6, 11)] == [records[s]["loss"] for s in range(6, 11)]
    with pytest.raises(SystemExit, match="mask_budget_schedule"):
        main(["train", "--output", str(out / "c"), *args[:-1], "cosine:0.3:0.15", "--resume",
              str(out / "a" / "checkpoints")])

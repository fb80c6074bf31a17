"""Masking strategies on real tokenized Debian text, checked against the HF collator, scipy and
plain Python references."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import DataCollatorForLanguageModeling

from maskstream.models import default_model
from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.masking import (
    STRATEGIES,
    MaskingConfig,
    apply_masking,
    expected_span_length,
    mix64,
    splitmix64,
)


def samples(rows, start=0):
    return [{**r, "sample_index": start + i} for i, r in enumerate(rows)]


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model())


@pytest.fixture(scope="module")
def config(hf_tokenizer):
    return MaskingConfig.from_tokenizer(hf_tokenizer)


@pytest.fixture(scope="module")
def batch(debian_rows, hf_tokenizer):
    return collate_sequences(samples(debian_rows), hf_tokenizer.pad_token_id)


def test_tensor_hash_is_splitmix64():
    values = [0, 1, 2**40 + 7, 2**63 - 1, -1, -(2**63), 123456789123456789]
    got = mix64(torch.tensor(values, dtype=torch.int64)).tolist()
    assert [g & (2**64 - 1) for g in got] == [splitmix64(v) for v in values]


def test_collate_pads_to_longest_multiple_of_8(debian_rows):
    rows = samples(debian_rows[:5])
    out = collate_sequences(rows, pad_token_id=0)
    longest = max(len(r["input_ids"]) for r in rows)
    assert out["input_ids"].shape == (5, math.ceil(longest / 8) * 8)
    assert collate_sequences(rows, pad_token_id=0, pad_to_multiple_of=None)["input_ids"].shape[1] == longest
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        assert out["input_ids"][i, :n].tolist() == list(r["input_ids"])
        assert out["attention_mask"][i].sum() == n
        assert out["special_tokens_mask"][i, n:].all() and (out["word_ids"][i, n:] == -1).all()
        assert (out["mask_probability"][i, n:] == 0).all()
        np.testing.assert_allclose(out["mask_probability"][i, :n].numpy(), r["mask_probability"])


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("whole_word", [False, True])
def test_specials_and_padding_never_masked_and_labels(batch, config, strategy, whole_word):
    cfg = MaskingConfig(**{**config.__dict__, "whole_word": whole_word})
    before = {k: v.clone() for k, v in batch.items()}
    out = apply_masking(batch, strategy, cfg, seed=3, epoch=1)
    assert all(torch.equal(before[k], batch[k]) for k in before)  # the input batch is not modified
    chosen = out["labels"] != -100
    assert chosen.any()
    assert not (chosen & batch["special_tokens_mask"]).any()
    assert not (chosen & ~batch["attention_mask"].bool()).any()
    assert torch.equal(out["labels"][chosen], batch["input_ids"][chosen])
    assert torch.equal(out["input_ids"][~chosen], batch["input_ids"][~chosen])
    # Random replacements come from the non-special vocabulary.
    assert not torch.isin(out["input_ids"][chosen], torch.tensor(
        [i for i in config.special_token_ids if i != config.mask_token_id])).any()


@pytest.mark.parametrize("strategy,whole_word", [("whole_word", False), ("difference", True), ("span", False)])
def test_whole_words_never_split(batch, config, strategy, whole_word):
    cfg = MaskingConfig(**{**config.__dict__, "whole_word": whole_word})
    for epoch in range(3):
        chosen = apply_masking(batch, strategy, cfg, seed=0, epoch=epoch)["labels"] != -100
        word_ids = batch["word_ids"]
        for row in range(word_ids.shape[0]):
            ids = word_ids[row][word_ids[row] >= 0]
            picked = chosen[row][word_ids[row] >= 0]
            for word in torch.unique(ids[picked]).tolist():
                assert picked[ids == word].all(), f"row {row} word {word} split"


def test_same_sample_same_mask_whatever_the_batch(debian_rows, config, hf_tokenizer):
    everything = samples(debian_rows[:64])
    subset = random.Random(0).sample(everything, 20)  # other neighbours, other order, other padding
    for strategy in STRATEGIES:
        full = apply_masking(collate_sequences(everything, 0), strategy, config, seed=5, epoch=2)
        part = apply_masking(collate_sequences(subset, 0, None), strategy, config, seed=5, epoch=2)
        for j, sample in enumerate(subset):
            i, n = sample["sample_index"], len(sample["input_ids"])
            assert torch.equal(full["input_ids"][i, :n], part["input_ids"][j, :n]), strategy
            assert torch.equal(full["labels"][i, :n], part["labels"][j, :n]), strategy
        other_epoch = apply_masking(collate_sequences(everything, 0), strategy, config, seed=5, epoch=3)
        assert not torch.equal(full["labels"], other_epoch["labels"]), strategy


def corruption_counts(original, masked, labels, mask_id):
    chosen = labels != -100
    as_mask = (masked == mask_id) & chosen
    kept = (masked == original) & chosen
    return int(chosen.sum()), int(as_mask.sum()), int((chosen & ~as_mask & ~kept).sum()), int(kept.sum())


def test_random_matches_hf_collator_statistically(debian_rows, batch, config, hf_tokenizer):
    """Masking rate over non-special tokens and the 80/10/10 split, ours vs HF's
    DataCollatorForLanguageModeling, over 8 passes of 400 real sequences (~150k maskable tokens,
    ~23k chosen). Both are binomial: each proportion is compared with the nominal value and the
    two with each other by a z-test, |z| < 4.5 (two-sided p ~ 7e-6 per comparison), so a
    correct implementation essentially never fails while a rate off by 1 point (z ~ 10) does."""
    torch.manual_seed(0)
    hf = DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=0.15)
    features = [{"input_ids": list(r["input_ids"]), "special_tokens_mask": list(r["special_tokens_mask"])} for r in debian_rows]
    maskable = int((batch["attention_mask"].bool() & ~batch["special_tokens_mask"]).sum())
    ours, theirs = np.zeros(4), np.zeros(4)
    for epoch in range(8):
        out = apply_masking(batch, "random", config, seed=11, epoch=epoch)
        ours += corruption_counts(batch["input_ids"], out["input_ids"], out["labels"], config.mask_token_id)
        ref = hf([dict(f) for f in features])
        original = collate_sequences(samples(debian_rows), hf_tokenizer.pad_token_id, None)["input_ids"]
        theirs += corruption_counts(original, ref["input_ids"], ref["labels"], config.mask_token_id)
    trials = 8 * maskable

    def z_two(k1, n1, k2, n2):
        pooled = (k1 + k2) / (n1 + n2)
        return (k1 / n1 - k2 / n2) / math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))

    def z_one(k, n, p):
        return (k / n - p) / math.sqrt(p * (1 - p) / n)

    assert abs(z_one(ours[0], trials, 0.15)) < 4.5 and abs(z_one(theirs[0], trials, 0.15)) < 4.5
    assert abs(z_two(ours[0], trials, theirs[0], trials)) < 4.5
    for part, nominal in zip((1, 2, 3), (0.8, 0.1, 0.1), strict=True):
        assert abs(z_one(ours[part], ours[0], nominal)) < 4.5, (part, ours)
        assert abs(z_two(ours[part], ours[0], theirs[part], theirs[0])) < 4.5, (part, ours, theirs)


def test_difference_frequency_proportional_to_stored_probability(debian_rows, config):
    """4000 draws of each of 4 real sequences (different sample indices give independent draws):
    every draw masks exactly round(0.15 n) tokens, and each token's count matches
    inclusion = p * k / sum(p) by a chi-square goodness-of-fit test. The same counts against
    uniform expectations are rejected, so the test has the power to see a wrong sampler."""
    draws = 4000
    for row in (debian_rows[3], debian_rows[17], debian_rows[42], debian_rows[99]):
        batch = collate_sequences([{**row, "sample_index": i} for i in range(draws)], 0)
        chosen = apply_masking(batch, "difference", config, seed=1, epoch=0)["labels"] != -100
        maskable = ~batch["special_tokens_mask"][0] & batch["attention_mask"][0].bool()
        k = round(0.15 * int(maskable.sum()))
        assert (chosen.sum(dim=1) == k).all()
        counts = chosen.sum(dim=0)[maskable].numpy().astype(float)
        p = np.asarray(row["mask_probability"], dtype=float)[maskable[: len(row["input_ids"])].numpy()]
        expected = p / p.sum() * k * draws
        assert expected.max() < draws  # no token certain: the test is about proportions
        assert stats.chisquare(counts, expected).pvalue > 1e-3
        uniform = np.full_like(expected, k * draws / len(expected))
        assert stats.chisquare(counts, uniform).pvalue < 1e-6


def test_tmr_and_span_rates(batch, config):
    maskable = batch["attention_mask"].bool() & ~batch["special_tokens_mask"]
    tmr = apply_masking(batch, "tmr", config, seed=0, epoch=0)
    chosen = tmr["labels"] != -100
    rate = chosen.sum().item() / maskable.sum().item()
    assert abs(rate - 0.1) < 4.5 * math.sqrt(0.09 / maskable.sum().item())
    assert (tmr["input_ids"][chosen] == config.mask_token_id).all()  # no 80/10/10
    span = apply_masking(batch, "span", config, seed=0, epoch=0)["labels"] != -100
    budget = torch.round(maskable.sum(dim=1).double() * 0.15)
    assert (span.sum(dim=1) <= budget).all()
    assert span.sum().item() >= 0.95 * budget.sum().item()
    assert abs(expected_span_length(config) - 3.8) < 0.05  # SpanBERT's figure


def test_span_lengths_follow_truncated_geometric(debian_rows, config):
    """Spans of whole words, lengths in words ~ Geometric(0.2) truncated at 10 (chi-square on the
    first span of each sequence, which the budget never truncates when the sequence is long)."""
    from maskstream.trainer.masking import choose_spans, sample_keys

    long_rows = [r for r in debian_rows if len(r["input_ids"]) == 128][:1]
    row = long_rows[0]
    batch = collate_sequences([{**row, "sample_index": i} for i in range(3000)], 0)
    keys = sample_keys(batch["sample_index"], 0, 0)
    chosen, span_id = choose_spans(batch, keys, config)
    words = batch["word_ids"][0]
    lengths = []
    for i in range(3000):
        first = span_id[i] == 0
        if first.any():
            lengths.append(len(torch.unique(words[first])))
    observed = np.bincount(lengths, minlength=11)[1:11]
    q = 0.8
    pmf = np.array([0.2 * q ** (m - 1) for m in range(1, 11)])
    pmf /= pmf.sum()
    # Spans starting near the end are cut by the sequence: only lengths 1..8 are compared.
    sel = slice(0, 8)
    expected = pmf[sel] / pmf[sel].sum() * observed[sel].sum()
    assert stats.chisquare(observed[sel], expected).pvalue > 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cuda_matches_cpu(batch, config, strategy):
    cpu = apply_masking(batch, strategy, config, seed=9, epoch=4)
    gpu = apply_masking({k: v.cuda() for k, v in batch.items()}, strategy, config, seed=9, epoch=4)
    for key in ("input_ids", "labels"):
        assert torch.equal(cpu[key], gpu[key].cpu()), key


def test_every_strategy_has_one_draw_and_unknown_names_fail_alike() -> None:
    """One registry: each name of STRATEGIES draws through DRAWS; masking and the train config refuse an
    unknown name with the same message (the HF collator: tests/trainer/test_hf_interop.py)."""
    from maskstream.trainer.config import TrainConfig
    from maskstream.trainer.masking import DRAWS
    from maskstream.trainer.strategies import PRETRAINING_STRATEGIES

    assert list(DRAWS) == list(STRATEGIES)
    assert "tmr" not in PRETRAINING_STRATEGIES
    with pytest.raises(ValueError, match=r"unknown masking strategy 'electra'; choose one of \('random'"):
        apply_masking({"sample_index": torch.zeros(1, dtype=torch.int64)}, "electra", None, seed=0, epoch=0)
    with pytest.raises(ValueError, match=r"unknown --strategy 'tmr'; choose one of \('random'"):
        TrainConfig(dataset="d", output="o", strategy="tmr")


@pytest.mark.parametrize("budget", [0.0, -0.1, 1.5])
def test_masking_config_refuses_the_budgets_the_build_refuses(config, budget) -> None:
    from maskstream.mask_signal.probability import MaskSettings

    with pytest.raises(ValueError, match=r"budget must be in \(0, 1\]"):
        MaskingConfig(**{**config.__dict__, "budget": budget})
    with pytest.raises(ValueError, match=r"--budget must be in \(0, 1\]"):
        MaskSettings(budget=budget)

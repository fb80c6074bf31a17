"""The peers' strategies (issue 52) on real tokenized Debian text with the peer signals of a
`--peer-signals` build of it (tests/trainer/conftest.py: debian_rows): PMI-Masking's whole units,
InforMask's exact, weighted budget, against the Hugging Face whole-word collator and scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import AutoTokenizer, DataCollatorForLanguageModeling

from maskstream.models import default_model
from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.masking import MaskingConfig, apply_masking


@pytest.fixture(scope="module")
def hf_tokenizer():
    return AutoTokenizer.from_pretrained(default_model())


@pytest.fixture(scope="module")
def config(hf_tokenizer) -> MaskingConfig:
    return MaskingConfig.from_tokenizer(hf_tokenizer)


@pytest.fixture(scope="module")
def batch(debian_rows):
    return collate_sequences([{**row, "sample_index": i} for i, row in enumerate(debian_rows)], 0)


def unit_sizes(batch) -> list[dict[int, int]]:
    """Per row: span id -> its maskable tokens."""
    maskable = batch["attention_mask"].bool() & ~batch["special_tokens_mask"]
    sizes = []
    for row in range(batch["span_ids"].shape[0]):
        ids, counts = torch.unique(batch["span_ids"][row][maskable[row]], return_counts=True)
        sizes.append(dict(zip(ids.tolist(), counts.tolist(), strict=True)))
    return sizes


@pytest.mark.parametrize("strategy", ["pmi_span", "difference_pmi_span"])
def test_pmi_units_are_masked_whole_and_to_the_budget(batch, config, strategy):
    maskable = batch["attention_mask"].bool() & ~batch["special_tokens_mask"]
    budget = torch.round(maskable.sum(dim=1).double() * 0.15).long()
    sizes = unit_sizes(batch)
    multiword_masked = 0
    for epoch in range(3):
        chosen = apply_masking(batch, strategy, config, seed=0, epoch=epoch)["labels"] != -100
        for row in range(chosen.shape[0]):
            spans = batch["span_ids"][row]
            picked = torch.unique(spans[chosen[row]]).tolist()
            for unit in picked:
                assert chosen[row][spans == unit].all(), f"row {row}: unit {unit} split"
            taken = int(chosen[row].sum())
            largest = max(sizes[row].values(), default=0)
            # whole units until the budget is reached: at least it, less than one more unit past it
            assert budget[row] <= taken < budget[row] + max(largest, 1), (row, taken, int(budget[row]))
            multiword_masked += sum(1 for unit in picked if (batch["word_ids"][row][spans == unit].unique().numel() > 1))
    assert multiword_masked > 0  # collocations are found and masked as one unit


def test_pmi_span_masks_about_what_the_hugging_face_whole_word_collator_does(debian_rows, batch, config, hf_tokenizer):
    """Both mask whole units to 15 %: the HF collator's realized share (whole words, per-word Bernoulli)
    and ours (units up to the budget, the last one passing it) over 4 passes of 400 real sequences."""
    maskable = batch["attention_mask"].bool() & ~batch["special_tokens_mask"]
    ours = sum(int((apply_masking(batch, "pmi_span", config, seed=2, epoch=e)["labels"] != -100).sum())
               for e in range(4)) / (4 * int(maskable.sum()))
    torch.manual_seed(0)
    collator = DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=0.15, whole_word_mask=True)
    texts = [hf_tokenizer.decode(row["input_ids"], skip_special_tokens=True) for row in debian_rows]
    # Padded by the tokenizer: the collator cannot pad `offset_mapping`, which whole-word masking needs.
    encoded = hf_tokenizer(texts, truncation=True, max_length=128, padding=True, return_offsets_mapping=True,
                           return_special_tokens_mask=True)
    features = [{k: encoded[k][i] for k in ("input_ids", "special_tokens_mask", "offset_mapping")}
                for i in range(len(texts))]
    theirs_total = int(sum(len(ids) - sum(special) for ids, special
                           in zip(encoded["input_ids"], encoded["special_tokens_mask"], strict=True)))
    theirs_masked = 0
    for _ in range(4):
        theirs_masked += int((collator([dict(f) for f in features])["labels"] != -100).sum())
    theirs_total *= 4
    theirs = theirs_masked / theirs_total
    assert 0.15 <= ours < 0.19, ours
    assert abs(ours - theirs) < 0.03, (ours, theirs)


def test_masked_unit_lengths_follow_the_documented_rule(batch, config):
    """PMI-Masking's rule as documented: a row's units in a uniformly random order, taken while the
    units taken before hold fewer tokens than the budget. The masked units' lengths in words are
    compared with a plain-Python simulation of that rule (random.shuffle) by a chi-square test. (A
    long unit is masked a little more often than its share of the units: the units before it
    in the order never include itself, so it is less often pushed past the budget.)"""
    import random

    maskable = batch["attention_mask"].bool() & ~batch["special_tokens_mask"]
    budget = torch.round(maskable.sum(dim=1).double() * 0.15).long().tolist()
    words, spans = batch["word_ids"], batch["span_ids"]
    rows = []  # per row: (words per unit, tokens per unit)
    for row in range(spans.shape[0]):
        units = torch.unique(spans[row][maskable[row]]).tolist()
        rows.append([(min(int(words[row][spans[row] == u].unique().numel()), 5),
                      int((spans[row][maskable[row]] == u).sum())) for u in units])
    observed, simulated = np.zeros(6), np.zeros(6)
    epochs = 6
    for epoch in range(epochs):
        chosen = apply_masking(batch, "pmi_span", config, seed=4, epoch=epoch)["labels"] != -100
        for row in range(spans.shape[0]):
            for unit in torch.unique(spans[row][chosen[row]]).tolist():
                observed[min(int(words[row][spans[row] == unit].unique().numel()), 5)] += 1
    shuffler = random.Random(0)
    trials = 40
    for row, units in enumerate(rows):
        for _ in range(trials):
            order = units[:]
            shuffler.shuffle(order)
            before = 0
            for length, tokens in order:
                if before >= budget[row]:
                    break
                simulated[length] += 1
                before += tokens
    expected = simulated[1:] / simulated[1:].sum() * observed[1:].sum()
    assert observed[2:].sum() > 0.1 * observed.sum()  # collocations of 2-5 words are a real share of the masks
    assert stats.chisquare(observed[1:], expected).pvalue > 1e-4, (observed, expected)


def test_informask_draws_exactly_the_budget_in_proportion_to_the_weights(debian_rows, config):
    draws = 4000
    for row in (debian_rows[3], debian_rows[42], debian_rows[99]):
        batch = collate_sequences([{**row, "sample_index": i} for i in range(draws)], 0)
        chosen = apply_masking(batch, "informask", config, seed=1, epoch=0)["labels"] != -100
        maskable = ~batch["special_tokens_mask"][0] & batch["attention_mask"][0].bool()
        k = round(0.15 * int(maskable.sum()))
        assert (chosen.sum(dim=1) == k).all()
        weights = np.asarray(row["informativeness"], float)[maskable[: len(row["input_ids"])].numpy()]
        positive = weights > 0
        counts = chosen.sum(dim=0)[maskable].numpy().astype(float)
        assert counts[~positive].sum() == 0  # punctuation (weight 0) is never drawn
        expected = weights[positive] / weights.sum() * k * draws
        assert expected.max() < draws
        assert stats.chisquare(counts[positive], expected).pvalue > 1e-3
        uniform = np.full_like(expected, k * draws / len(expected))
        assert stats.chisquare(counts[positive], uniform).pvalue < 1e-6


def test_difference_pmi_span_prefers_units_of_high_probability(batch, config):
    """Units raced by summed mask probability: over many epochs, a unit's masking frequency rises with it."""
    row = 7
    spans = batch["span_ids"][row]
    probability = batch["mask_probability"][row]
    units = torch.unique(spans[spans >= 0]).tolist()
    weight = np.array([float(probability[spans == u].sum()) for u in units])
    hits = np.zeros(len(units))
    single = {k: v[row : row + 1] for k, v in batch.items()}
    for epoch in range(300):
        chosen = apply_masking(single, "difference_pmi_span", config, seed=9, epoch=epoch)["labels"][0] != -100
        hits += [bool(chosen[spans == u].any()) for u in units]
    assert stats.spearmanr(weight, hits).statistic > 0.5


def test_informask_fills_a_sequence_with_too_few_weighted_tokens(debian_rows, config):
    """Weighted tokens fewer than the budget: all of them, and the rest of the budget drawn uniformly
    from the tokens of weight 0, so the sequence still gets exactly its budget."""
    row = dict(debian_rows[42])
    weights = np.zeros(len(row["input_ids"]), np.float32)
    maskable = ~np.asarray(row["special_tokens_mask"], bool)
    weighted = np.flatnonzero(maskable)[:3]
    weights[weighted] = 0.5
    row["informativeness"] = weights
    batch = collate_sequences([{**row, "sample_index": i} for i in range(500)], 0)
    chosen = apply_masking(batch, "informask", config, seed=0, epoch=0)["labels"] != -100
    budget = round(0.15 * int(maskable.sum()))
    assert budget > 3 and (chosen.sum(dim=1) == budget).all()
    assert chosen[:, weighted].all()
    others = chosen[:, : len(weights)][:, maskable & (weights == 0)].sum(dim=0).numpy()
    assert stats.chisquare(others).pvalue > 1e-3  # uniform over the rest

"""Sequences that cannot reach their masking budget, end to end: the build's map leaves a
code-heavy sequence short (too few tokens with p > 0), the tally counts it and the expected masks
it misses (`maskstream.pipelines.dataset.core.signal_tallies.budget_shortfall`), the printout says so and names `--floor`,
and the loader's exact-k draw (`maskstream.trainer.masking`) masks every token with p > 0 in it and never one
with p = 0. A floor closes the gap."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from maskstream.mask_signal.probability import mask_probabilities_flat
from maskstream.pipelines.dataset.core.signal_tallies import (
    WordsForReport,
    budget_shortfall,
    merge_tallies,
    signal_report,
    tally,
)
from maskstream.pipelines.dataset.inspect.signal import format_report
from maskstream.schemas.manifest import Manifest
from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.masking import (
    MaskingConfig,
    apply_masking,
    budget_counts,
    choose_difference,
    maskable,
    sample_keys,
)

BUDGET = 0.15
CONFIG = MaskingConfig(mask_token_id=103, vocab_size=30522, special_token_ids=(0, 100, 101, 102, 103), budget=BUDGET)


def code_heavy_sequence(positive_words: int = 11) -> dict[str, np.ndarray]:
    """[CLS] + 100 tokens + [SEP]: 25 outside any word (`{`, `;`, `=` ...), 64 of identifiers whose
    similarity to the seeds is <= 0, and `positive_words` one-token words of similarity > 0."""
    outside, unlike = 25, 100 - 25 - positive_words
    word_index = np.array([-1] * outside + [0] * unlike + list(range(1, positive_words + 1)), np.int64)
    order = np.random.default_rng(7).permutation(100)
    word_index = np.concatenate([[-1], word_index[order], [-1]])
    # One token per word; punctuation has word ids too (the tokenizer's pre-tokens), no word index.
    word_ids = np.concatenate([[-1], np.arange(100), [-1]])
    special = np.zeros(102, np.int8)
    special[[0, -1]] = 1
    input_ids = np.concatenate([[101], 2000 + np.arange(100), [102]])
    return {"input_ids": input_ids, "word_ids": word_ids, "word_index": word_index, "special_tokens_mask": special}


def similarity(positive_words: int = 11) -> np.ndarray:
    return np.array([-0.05] + [0.2 + 0.01 * i for i in range(positive_words)], np.float32)


def probabilities(sequence: dict[str, np.ndarray], floor: float) -> np.ndarray:
    offsets = np.array([0, len(sequence["input_ids"])])
    return mask_probabilities_flat(sequence["word_ids"], sequence["word_index"], sequence["special_tokens_mask"],
                                   offsets, similarity(), budget=BUDGET, floor=floor, width=128)


def test_the_tally_counts_a_code_heavy_sequence_and_the_expected_masks_it_misses() -> None:
    sequence = code_heavy_sequence()
    p = probabilities(sequence, floor=0.0)
    offsets = np.array([0, len(p)])
    assert np.count_nonzero(p) == 11 and p.sum() == pytest.approx(11.0)  # the 11 words, each at p = 1
    shortfall = budget_shortfall(sequence["special_tokens_mask"], p, offsets, BUDGET)
    assert shortfall["short_sequences"][0] == 1 and shortfall["missing_masks"][0] == pytest.approx(15.0 - 11.0)
    # A sequence with enough positive tokens reaches its budget; tallies of batches add up.
    ordinary = code_heavy_sequence(positive_words=60)
    ordinary_offsets = np.array([0, 102])
    ordinary_p = mask_probabilities_flat(ordinary["word_ids"], ordinary["word_index"], ordinary["special_tokens_mask"],
                                         ordinary_offsets, similarity(60), budget=BUDGET, width=128)
    merged = merge_tallies([
        tally(sequence["word_index"], sequence["special_tokens_mask"], p, offsets, BUDGET),
        tally(ordinary["word_index"], ordinary["special_tokens_mask"], ordinary_p, ordinary_offsets, BUDGET),
    ])
    assert (merged["sequences"][0], merged["short_sequences"][0]) == (2, 1)
    assert merged["missing_masks"][0] == pytest.approx(4.0)
    # With a floor every token has p > 0, and the short sequence's floor is raised: nothing is short.
    floored = probabilities(sequence, floor=0.01)
    valid = sequence["special_tokens_mask"] == 0
    assert floored.sum(dtype=np.float64) == pytest.approx(15.0, rel=1e-6) and floored[valid].min() > 0.01
    assert (np.argsort(floored[valid], kind="stable") == np.argsort(p[valid], kind="stable")).all()  # same order
    assert budget_shortfall(sequence["special_tokens_mask"], floored, offsets, BUDGET)["short_sequences"][0] == 0


def test_the_report_and_printout_give_the_shortfall_and_name_the_floor() -> None:
    sequence = code_heavy_sequence()
    p = probabilities(sequence, floor=0.0)
    counts = tally(sequence["word_index"], sequence["special_tokens_mask"], p, np.array([0, len(p)]), BUDGET)
    words = ["unlike"] + [f"word{i}" for i in range(11)]
    report = signal_report(counts, WordsForReport.of_table(word_table_of(words)), ["word0"], ["the"])
    assert report["budget_shortfall"] == {"tolerance": 0.01, "sequences": 1, "short_sequences": 1, "short_share": 1.0,
                                          "missing_masks": pytest.approx(4.0),
                                          "missing_share_of_their_budget": pytest.approx(4.0 / 15.0)}
    printed = "\n".join(format_report(report))
    assert "1 of 1 sequences (100.0%) are more than 1% below their masking budget" in printed
    assert "missing 4.0 expected masks" in printed and "--floor" in printed


def test_a_manifest_without_the_shortfall_still_loads_and_prints() -> None:
    from maskstream.pipelines.dataset.inspect.signal import build_lines

    sequence = code_heavy_sequence()
    p = probabilities(sequence, floor=0.0)
    counts = tally(sequence["word_index"], sequence["special_tokens_mask"], p, np.array([0, len(p)]), BUDGET)
    report = signal_report(counts, WordsForReport.of_table(word_table_of(["unlike"] + [f"word{i}" for i in range(11)])),
                           [], [])
    del report["budget_shortfall"]  # as written before issue 31
    manifest = Manifest(version="v1", created_at="2026-01-01T00:00:00Z", tokenizer={}, encoder={}, seeds=[],
                        formulas={}, config={}, source_fingerprint={}, shards=[], diagnostics=report)
    loaded = Manifest.from_json(manifest.to_json())
    assert "budget_shortfall" not in loaded.diagnostics
    assert "budget shortfall" not in "\n".join(build_lines(loaded.diagnostics))


@pytest.mark.parametrize("whole_word", [False, True])
def test_the_loader_masks_every_positive_token_of_a_short_sequence_and_never_a_zero_one(whole_word: bool) -> None:
    sequence = code_heavy_sequence()
    p = probabilities(sequence, floor=0.0)
    rows = [{**sequence, "mask_probability": p, "sample_index": index} for index in range(64)]
    batch = collate_sequences(rows, pad_token_id=0)
    config = MaskingConfig(**{**CONFIG.__dict__, "whole_word": whole_word})
    assert int(budget_counts(maskable(batch), BUDGET)[0]) == 15  # k = round(0.15 x 100)
    positive = batch["mask_probability"] > 0
    for epoch in range(3):
        chosen = choose_difference(batch, sample_keys(batch["sample_index"], 0, epoch), config)
        assert torch.equal(chosen, positive)  # all 11 tokens with p > 0, and no other: 4 short of k
    masked = apply_masking(batch, "difference", config, seed=0, epoch=0)
    assert torch.equal(masked["labels"] != -100, positive)


def test_with_a_floor_the_loader_draws_exactly_the_budget() -> None:
    sequence = code_heavy_sequence()
    rows = [{**sequence, "mask_probability": probabilities(sequence, floor=0.01), "sample_index": i} for i in range(64)]
    batch = collate_sequences(rows, pad_token_id=0)
    chosen = choose_difference(batch, sample_keys(batch["sample_index"], 0, 0), CONFIG)
    assert chosen.sum(dim=1).tolist() == [15] * 64
    assert not (chosen & ~maskable(batch)).any()


def test_the_shortfall_reaches_the_manifest_through_the_builds_tallies() -> None:
    """map_tallies (what the build and update merge into `diagnostics`) carries the shortfall."""
    from maskstream.pipelines.dataset.core.signal_tallies import build_diagnostics, map_tallies

    sequence = code_heavy_sequence()
    p = probabilities(sequence, floor=0.0)
    rows = pa.table({
        "sequence_id": pa.array([0], pa.int64()),
        "word_ids": pa.array([sequence["word_ids"].tolist()], pa.list_(pa.int32())),
        "word_index": pa.array([sequence["word_index"].tolist()], pa.list_(pa.int32())),
        "special_tokens_mask": pa.array([sequence["special_tokens_mask"].tolist()], pa.list_(pa.int8())),
        "mask_probability": pa.array([p.tolist()], pa.list_(pa.float32())),
    })
    config = {"budget": BUDGET, "alpha": 1.0, "weighting": "similarity", "sharpness": 1.0, "floor": 0.0,
              "max_length": 128}
    names = ["unlike"] + [f"word{i}" for i in range(11)]
    diagnostics = build_diagnostics(map_tallies(rows, similarity(), config, 1),
                                    WordsForReport.of_table(word_table_of(names)), ["word0"])
    assert diagnostics["budget_shortfall"]["short_sequences"] == 1
    assert diagnostics["budget_shortfall"]["missing_masks"] == pytest.approx(4.0)
    paper = next(v for k, v in diagnostics["comparison"].items() if k.startswith("paper"))
    assert paper["budget_shortfall"]["short_sequences"] == 1  # the paper's map is this one


def word_table_of(names: list[str]) -> pa.Table:
    """The columns of WORD_TABLE_SCHEMA that the diagnostics read."""
    return pa.table({"word": names, "word_index": list(range(len(names))),
                     "similarity": similarity().tolist()})

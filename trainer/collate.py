"""Collation: pad a list of samples to the batch's longest sequence and stack them as tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

# column -> (dtype, padding value); padding is a special token that is never masked.
PADDED_COLUMNS: dict[str, tuple[np.dtype, Any]] = {
    "input_ids": (np.dtype(np.int64), None),  # the tokenizer's pad id
    "attention_mask": (np.dtype(np.int64), 0),
    "mask_probability": (np.dtype(np.float32), 0.0),
    "word_ids": (np.dtype(np.int64), -1),
    "special_tokens_mask": (np.dtype(np.bool_), True),
}
# Collated when the samples carry them: the peer signals (maskstream.mask_signal.peer_lookup).
OPTIONAL_COLUMNS: dict[str, tuple[np.dtype, Any]] = {
    "span_ids": (np.dtype(np.int64), -1),
    "informativeness": (np.dtype(np.float32), 0.0),
}


def collate_sequences(
    samples: Sequence[dict[str, Any]], pad_token_id: int, pad_to_multiple_of: int | None = 8,
    longest: int | None = None,
) -> dict[str, torch.Tensor]:
    """Pads `samples` (dicts with the SEQUENCE_SCHEMA list columns as 1-D arrays and
    `sample_index`) to the longest one, rounded up to `pad_to_multiple_of`, and returns
    `input_ids`, `attention_mask`, `mask_probability`, `word_ids`, `special_tokens_mask`
    (bool) and `sample_index`, and `span_ids` and `informativeness` when the samples have them.
    Padding: pad id, attention 0, probability 0, word id and span id -1, special, informativeness 0.
    `longest`: the longest sequence of the batch these samples were drawn from (held-out rows left
    out), when longer: masks depend on the width, so the rows keep the one their whole batch had."""
    if not samples:
        raise ValueError("cannot collate an empty batch")
    lengths = [len(s["input_ids"]) for s in samples]
    width = max(max(lengths), longest or 0)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    # A mixture collates rows of several sources: a row without an optional column keeps its padding.
    columns = {**PADDED_COLUMNS, **{name: spec for name, spec in OPTIONAL_COLUMNS.items()
                                    if any(name in sample for sample in samples)}}
    arrays = {
        name: np.full((len(samples), width), pad_token_id if pad is None else pad, dtype=dtype)
        for name, (dtype, pad) in columns.items()
    }
    copied = [name for name in columns if name != "attention_mask"]
    for i, (sample, length) in enumerate(zip(samples, lengths, strict=True)):
        arrays["attention_mask"][i, :length] = 1
        for name in copied:
            if name in sample:
                arrays[name][i, :length] = sample[name]
    batch = {name: torch.from_numpy(array) for name, array in arrays.items()}
    batch["sample_index"] = torch.tensor([int(s["sample_index"]) for s in samples], dtype=torch.int64)
    return batch

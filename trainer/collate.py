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


def collate_sequences(
    samples: Sequence[dict[str, Any]], pad_token_id: int, pad_to_multiple_of: int | None = 8
) -> dict[str, torch.Tensor]:
    """Pads `samples` (dicts with the SEQUENCE_SCHEMA list columns as 1-D arrays and
    `sample_index`) to the longest one, rounded up to `pad_to_multiple_of`, and returns
    `input_ids`, `attention_mask`, `mask_probability`, `word_ids`, `special_tokens_mask`
    (bool) and `sample_index`. Padding: pad id, attention 0, probability 0, word id -1, special."""
    if not samples:
        raise ValueError("cannot collate an empty batch")
    lengths = [len(s["input_ids"]) for s in samples]
    width = max(lengths)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    arrays = {
        name: np.full((len(samples), width), pad_token_id if pad is None else pad, dtype=dtype)
        for name, (dtype, pad) in PADDED_COLUMNS.items()
    }
    for i, (sample, length) in enumerate(zip(samples, lengths, strict=True)):
        arrays["attention_mask"][i, :length] = 1
        for name in ("input_ids", "mask_probability", "word_ids", "special_tokens_mask"):
            arrays[name][i, :length] = sample[name]
    batch = {name: torch.from_numpy(array) for name, array in arrays.items()}
    batch["sample_index"] = torch.tensor([int(s["sample_index"]) for s in samples], dtype=torch.int64)
    return batch

"""Text becomes samples in one place: a `--mix` text source (maskstream.trainer.text_source) and the
Hugging Face collator (maskstream.trainer.hf) both encode with `TextEncoder` and build samples with
`text_samples`, so that their words, and the masks drawn on them, are the ones a build would store.

Words always follow maskstream's word rule (maskstream.mask_signal.words, as `maskstream build` finds
them), never the tokenizer's own `word_ids()`: with a version's mask map, its word ids and mask
probabilities; without one, the same rule's word ids and probability 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from maskstream.mask_signal.alignment import encoding_arrays, word_ids_of_text
from maskstream.mask_signal.mask_map import MaskMap


class TextEncoder:
    """A copy of a fast tokenizer's Rust backend that truncates to `max_length` tokens, as
    `tokenizer(texts, truncation=True, max_length=...)` does, without the per-token Python conversion of
    its output."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"tokenizer {tokenizer.name_or_path} is not a fast tokenizer: words are found from the "
                             "character offsets only a fast (Rust) tokenizer gives")
        self.backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        self.backend.no_padding()
        self.backend.enable_truncation(max_length)

    def encode(self, texts: Sequence[str]) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """(int64 token ids, [tokens, 2] character offsets, int8 special-token mask) of each text."""
        encodings = self.backend.encode_batch(list(texts))
        counts, flat_ids, pairs = encoding_arrays(encodings)
        flat_special = np.fromiter(itertools.chain.from_iterable(e.special_tokens_mask for e in encodings),
                                   np.int8, len(flat_ids))
        bounds = np.cumsum(counts)[:-1]
        return ([ids.astype(np.int64) for ids in np.split(flat_ids, bounds)], np.split(pairs, bounds),
                np.split(flat_special, bounds))


def text_samples(texts: Sequence[str], ids: Sequence[np.ndarray], offsets: Sequence[np.ndarray],
                 special: Sequence[np.ndarray], sample_indices: Sequence[int], *, mask_map: MaskMap | None,
                 width: int, peer_columns: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Samples of encoded texts, with the columns `collate_sequences` pads: word ids and mask
    probabilities from `mask_map` (padded to `width` inside, as the build pads to its max length), or
    maskstream's word rule and probability 0 without one; `peer_columns` from the map's peer signals.
    `sample_indices` key each sample's masks."""
    if mask_map is None:
        if peer_columns:
            raise ValueError(f"peer-signal columns {peer_columns} need a mask map with peer signals")
        word_ids = [word_ids_of_text(t, o, s).astype(np.int64) for t, o, s in zip(texts, offsets, special, strict=True)]
        probability = [np.zeros(len(i), np.float32) for i in ids]
        peer: dict[str, list[np.ndarray]] = {}
    else:
        flat_words, word_index, p, bounds = mask_map.token_words_and_signal(texts, offsets, special, width=width)
        rows = [slice(bounds[i], bounds[i + 1]) for i in range(len(texts))]
        word_ids, probability = [flat_words[r] for r in rows], [p[r] for r in rows]
        peer = ({name: [values[r] for r in rows] for name, values in
                 mask_map.peer_signals.columns(flat_words, word_index, bounds, peer_columns).items()}
                if peer_columns else {})
    return [{"input_ids": ids[i], "special_tokens_mask": np.asarray(special[i], bool), "word_ids": word_ids[i],
             "mask_probability": probability[i], "sample_index": int(sample_indices[i]),
             **{name: values[i] for name, values in peer.items()}} for i in range(len(texts))]

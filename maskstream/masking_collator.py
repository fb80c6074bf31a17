"""`DifferenceMaskingCollator`: maskstream's masks for any dataset, in the loop a user already has.

A `data_collator` / `collate_fn` that takes rows of raw text (or tokenized rows), tokenizes them,
computes each token's mask probability with a version's `MaskMap`, and masks with the trainer's
strategies (`maskstream.trainer.masking`: difference, whole word, random, span; 80/10/10 from
`MaskingConfig`), one vectorized step a batch. No shards, no Beam:

    from datasets import load_dataset
    from transformers import AutoTokenizer, Trainer, TrainingArguments
    from maskstream import DifferenceMaskingCollator, MaskMap

    mask_map = MaskMap.from_version("gs://bucket/dataset")
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    stream = load_dataset("json", data_files="corpus/*.jsonl", split="train", streaming=True)
    collator = DifferenceMaskingCollator(mask_map, tokenizer)
    Trainer(model=model, args=TrainingArguments(..., remove_unused_columns=False),
            train_dataset=stream, data_collator=collator).train()

Rows (any mix in a batch):
- a string, or a mapping with `text_column`: tokenized here, truncated to `max_length`;
- a mapping with `input_ids` and, to align words, either `offset_mapping` and the `text_column`
  they index, or neither: the text is then recovered with `tokenizer.decode` and checked by
  encoding it again (exact for byte-level BPE; for WordPiece and SentencePiece only spacing
  changes, which no word spans). A word the row's truncation cut comes back cut, so its tokens
  weigh as that fragment's word (give the text and offsets to keep the whole word's weight). A row
  whose ids do not come back is masked without words (every token its own word, uniform
  probabilities) and counted in `rows_without_words`.
  `special_tokens_mask` is taken from the row, else from the tokenizer's special ids.

Randomness: a row's mask is a function of (seed, epoch, sample index, its tokens), as in
`maskstream train`: for the same three and the same tokens it draws the same mask (in a batch of
the same width, since the strategies draw over the padded row). The sample index is the row's
`sample_index` if it has one (e.g. `dataset.map(lambda row, i: {"sample_index": i}, with_indices=True)`);
otherwise the collator numbers rows itself, worker by worker (counter * workers + worker id), which
is unique in a run but depends on the loader's workers. Set `collator.epoch` (or `set_epoch`) each epoch.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from maskstream.mask_map import MaskMap
from maskstream.pipelines.build.core.sequences import encoding_arrays
from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.masking import STRATEGIES, MaskingConfig, apply_masking
from maskstream.trainer.world import World

LOG = logging.getLogger("maskstream.collator")

MODEL_INPUTS = ("input_ids", "attention_mask", "labels")


class DifferenceMaskingCollator:
    """Rows of text or token ids -> `input_ids`, `attention_mask`, `labels` for a masked-LM forward.

    mask_map: the version's MaskMap (`MaskMap.from_version`), which gives each word its probability.
    tokenizer: a fast Hugging Face tokenizer with a pad token, the version's own unless
    allow_other_tokenizer (its vocabulary hash is checked). strategy: a masking strategy name
    (default `difference`). max_length: tokens per row (default: the version's). masking: the
    budget and 80/10/10 (default: from the tokenizer, the version's budget). seed: the masks' seed.
    text_column: the field of a row that holds its text. pad_to_multiple_of: pad each batch's length
    to a multiple of this (None: to the longest row).
    """

    def __init__(
        self,
        mask_map: MaskMap,
        tokenizer: Any,
        strategy: str = "difference",
        *,
        max_length: int | None = None,
        masking: MaskingConfig | None = None,
        seed: int = 0,
        text_column: str = "text",
        pad_to_multiple_of: int | None = 8,
        allow_other_tokenizer: bool = False,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown masking strategy {strategy!r}; choose one of {tuple(STRATEGIES)}")
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"tokenizer {tokenizer.name_or_path} is not a fast tokenizer: words are found from the "
                             "character offsets only a fast (Rust) tokenizer gives")
        if tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path} has no pad token: set one before collating")
        mask_map.check_tokenizer(tokenizer, allow_other_tokenizer)
        self.mask_map = mask_map
        self.tokenizer = tokenizer
        self.strategy = strategy
        self.max_length = max_length or int(mask_map.settings["max_length"])
        self.masking = masking or MaskingConfig.from_tokenizer(tokenizer, budget=float(mask_map.settings["budget"]))
        self.seed = seed
        self.text_column = text_column
        self.pad_to_multiple_of = pad_to_multiple_of
        # The tokens a tokenizer adds around or between texts; [UNK] stands for text, as in the build.
        self.special_ids = np.array(sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}), np.int64)
        # Raw text is encoded by a copy of the Rust tokenizer, truncating as `tokenizer(texts,
        # truncation=True, max_length=...)` does, without the per-token Python conversion of its output.
        self.backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        self.backend.no_padding()
        self.backend.enable_truncation(self.max_length)
        self.epoch = 0
        self.rows_seen = 0  # rows this copy numbered itself (per loader worker)
        self.rows_without_words = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, rows: Sequence[Any]) -> dict[str, torch.Tensor]:
        if not len(rows):
            raise ValueError("cannot collate an empty batch")
        texts, ids, offsets, special = self.encoded(rows)
        word_ids, p, bounds = self.mask_map.token_signal(texts, offsets, special, width=self.max_length)
        samples = [{"input_ids": ids[i], "special_tokens_mask": special[i],
                    "word_ids": word_ids[bounds[i] : bounds[i + 1]], "mask_probability": p[bounds[i] : bounds[i + 1]],
                    "sample_index": index} for i, index in enumerate(self.sample_indices(rows))]
        batch = collate_sequences(samples, int(self.tokenizer.pad_token_id), self.pad_to_multiple_of)
        masked = apply_masking(batch, self.strategy, self.masking, seed=self.seed, epoch=self.epoch)
        return {name: masked[name] for name in MODEL_INPUTS}

    def sample_indices(self, rows: Sequence[Any]) -> list[int]:
        """Each row's `sample_index`, or this copy's own numbering (interleaved across loader workers)."""
        world = World.detect(0, 1)  # the worker only: rows are numbered per copy of the collator
        workers, worker = world.workers, world.worker
        out = []
        for row in rows:
            if isinstance(row, Mapping) and "sample_index" in row:
                out.append(int(row["sample_index"]))
            else:
                out.append(self.rows_seen * workers + worker)
                self.rows_seen += 1
        return out

    def encoded(self, rows: Sequence[Any]) -> tuple[list[str], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """(text, token ids, character offsets into the text, special-token mask) of every row."""
        texts: list[str | None] = []
        ids: list[Any] = []
        offsets: list[Any] = []
        raw: list[int] = []  # rows to tokenize here
        for i, row in enumerate(rows):
            if isinstance(row, str) or (isinstance(row, Mapping) and "input_ids" not in row):
                text = row if isinstance(row, str) else row[self.text_column]
                texts.append(text)
                ids.append(None)
                offsets.append(None)
                raw.append(i)
            elif "offset_mapping" in row and self.text_column in row:
                texts.append(row[self.text_column])
                ids.append(np.asarray(row["input_ids"], np.int64))
                offsets.append(np.asarray(row["offset_mapping"], np.int64).reshape(-1, 2))
            else:
                text, ids_i, offsets_i = self.decoded(np.asarray(row["input_ids"], np.int64))
                texts.append(text)
                ids.append(ids_i)
                offsets.append(offsets_i)
        special: list[Any] = [None] * len(rows)
        if raw:
            encodings = self.backend.encode_batch([texts[i] for i in raw])
            counts, flat_ids, pairs = encoding_arrays(encodings)
            flat_special = np.fromiter(itertools.chain.from_iterable(e.special_tokens_mask for e in encodings),
                                       np.int8, len(flat_ids))
            bounds = np.cumsum(counts)[:-1]
            for i, row_ids, row_offsets, row_special in zip(raw, np.split(flat_ids, bounds), np.split(pairs, bounds),
                                                             np.split(flat_special, bounds), strict=True):
                ids[i], offsets[i], special[i] = row_ids.astype(np.int64), row_offsets, row_special
        for i, row in enumerate(rows):
            if special[i] is None:
                given = row.get("special_tokens_mask")
                special[i] = (np.asarray(given, np.int8) if given is not None
                              else np.isin(ids[i], self.special_ids).astype(np.int8))
            if not len(ids[i]) == len(offsets[i]) == len(special[i]):
                raise ValueError(f"row {i}: input_ids, offset_mapping and special_tokens_mask have "
                                 f"{len(ids[i])}, {len(offsets[i])} and {len(special[i])} entries")
        return texts, ids, offsets, special

    def decoded(self, ids: np.ndarray) -> tuple[str, np.ndarray, np.ndarray]:
        """A tokenized row without text: each run of non-special tokens decoded on its own (a special
        token's text would shift the first word's offsets) and checked by encoding it again; the runs
        joined by "\n", never part of a word. If the ids do not come back, every token is an
        occurrence of its own with no word."""
        body = ~np.isin(ids, self.special_ids)
        edges = np.flatnonzero(np.diff(body.astype(np.int8), prepend=np.int8(0), append=np.int8(0)))
        offsets = np.zeros((len(ids), 2), np.int64)
        pieces: list[str] = []
        base = 0
        for start, end in zip(edges[0::2], edges[1::2], strict=True):
            piece = self.tokenizer.decode(ids[start:end].tolist(), clean_up_tokenization_spaces=False)
            again = self.tokenizer(piece, add_special_tokens=False, return_offsets_mapping=True)
            if list(again["input_ids"]) != ids[start:end].tolist():
                self.rows_without_words += 1
                if self.rows_without_words == 1:
                    LOG.warning("a tokenized row without text does not decode to its own ids: it is masked without "
                                "words (uniform probabilities); give rows their text and offset_mapping to keep "
                                "the signal")
                return "", ids, np.zeros((len(ids), 2), np.int64)  # zero-width offsets: no token in a word
            offsets[start:end] = np.asarray(again["offset_mapping"], np.int64).reshape(-1, 2) + base
            pieces.append(piece)
            base += len(piece) + 1
        return "\n".join(pieces), ids, offsets

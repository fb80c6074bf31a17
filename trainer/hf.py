"""Hugging Face interop: a version's shards in `datasets`, and maskstream's masks in `transformers.Trainer`.

With `datasets` (one row per sequence; columns: `maskstream.schemas.tables.SEQUENCE_SCHEMA`):

    from datasets import load_dataset
    from maskstream.trainer.hf import shard_urls
    rows = load_dataset("parquet", data_files=shard_urls("gs://bucket/dataset"), split="train")

With `transformers.Trainer` (single process; `maskstream train` is the multi-GPU path):

    from transformers import AutoModelForMaskedLM, Trainer, TrainingArguments
    from maskstream.trainer.dataset import StreamingSequenceDataset
    from maskstream.trainer.hf import MaskingCollator

    dataset = StreamingSequenceDataset("out/demo/dataset", seed=0)
    model = AutoModelForMaskedLM.from_pretrained(MODEL)
    args = TrainingArguments("out/hf", max_steps=100, per_device_train_batch_size=16, report_to=[],
                             remove_unused_columns=False)  # the collator needs every column
    Trainer(model=model, args=args, train_dataset=dataset,
            data_collator=MaskingCollator(dataset, "difference")).train()

The collator draws the same masks as `maskstream train` for the same (seed, epoch, sample): it pads
with `maskstream.trainer.collate.collate_sequences` and masks with `maskstream.trainer.masking.apply_masking`, reading
the epoch from the dataset (which `Trainer` advances with `set_epoch`).

A mixture (`maskstream train --mix`, `maskstream.trainer.mixture`) in `transformers.Trainer`: its rows
one at a time, batched again by the Trainer with the mixture's batch size, masked by source:

    from maskstream.trainer.mixture import build_mixture
    from maskstream.trainer.hf import MixtureCollator, MixtureRows

    domain = StreamingSequenceDataset("out/demo/dataset", seed=0)
    mixture = build_mixture(domain, ["general.jsonl:0.2"], tokenizer, strategy="difference", seed=0,
                            batch_size=16)
    Trainer(model=model, args=args,  # per_device_train_batch_size=16, remove_unused_columns=False
            train_dataset=MixtureRows(mixture), data_collator=MixtureCollator(mixture)).train()

Any text, in the loop a user already has, with a version's signal applied at load time
(`DifferenceMaskingCollator`, below; exported as `maskstream.DifferenceMaskingCollator`). The three
collators here draw masks as the loader's workers and `maskstream train` do: rows padded by
`collate_sequences` (a mixture's joined by `concat_rows`), masked by `apply_masking` (a mixture's
through `mask_by_source`), the one place masks are drawn.

`DifferenceMaskingCollator`, in more detail: maskstream's masks for any dataset.

A `data_collator` / `collate_fn` that takes rows of raw text (or tokenized rows), tokenizes them,
computes each token's mask probability with a version's `MaskMap`, and masks with the trainer's
strategies (`maskstream.trainer.masking`: difference, whole word, random, span; 80/10/10 from
`MaskingConfig`), one vectorized step a batch. No shards, no Beam:

    from datasets import load_dataset
    from transformers import AutoTokenizer, Trainer, TrainingArguments
    from maskstream import DifferenceMaskingCollator, MaskMap  # (maskstream.trainer.hf)

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
otherwise the collator numbers rows itself, by worker and rank ((counter * workers + worker id) *
ranks + rank), which is unique in a run but depends on the loader's workers and the ranks. Set `collator.epoch` (or `set_epoch`) each epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from maskstream.mask_signal.mask_map import MaskMap
from maskstream.mask_signal.peer_lookup import PeerSignalsMissing
from maskstream.schemas.manifest import load_manifest, safe_relative_path
from maskstream.trainer.collate import PADDED_COLUMNS, collate_sequences
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.masking import MaskingConfig, apply_masking
from maskstream.trainer.mixture import Mixture, mask_by_source
from maskstream.trainer.strategies import PEER_SIGNAL_STRATEGIES, check_strategy, peer_columns
from maskstream.trainer.text_samples import TextEncoder, text_samples
from maskstream.trainer.world import World

LOG = logging.getLogger("maskstream.collator")
MODEL_INPUTS = ("input_ids", "attention_mask", "labels")


def shard_urls(dataset: str) -> list[str]:
    """The Parquet shard URLs of a dataset version (a root's `latest`, or a version folder), in
    manifest order, for `datasets.load_dataset("parquet", data_files=...)` or any Parquet reader."""
    version_url, manifest = load_manifest(dataset)
    return [f"{version_url}/{safe_relative_path(shard.path)}" for shard in manifest.shards]


class MaskingCollator:
    """A `data_collator` for `transformers.Trainer`: pads streamed rows and draws masks.

    Returns only what a masked-LM forward takes (`input_ids`, `attention_mask`, `labels`).
    """

    def __init__(
        self,
        dataset: StreamingSequenceDataset,
        strategy: str = "difference",
        masking: MaskingConfig | None = None,
        seed: int = 0,
    ) -> None:
        check_strategy(strategy)
        pad_token_id = dataset.manifest.tokenizer.get("pad_token_id")
        if pad_token_id is None:
            raise ValueError(f"manifest tokenizer entry lacks pad_token_id; it has {sorted(dataset.manifest.tokenizer)}")
        if not set(peer_columns(strategy)) <= set(dataset.peer_columns):
            raise PeerSignalsMissing(f"{strategy} reads the version's peer signals: open the dataset with "
                                     f"StreamingSequenceDataset(..., peer_columns={peer_columns(strategy)}), on a "
                                     "version built with `maskstream build --peer-signals`")
        self.dataset = dataset
        self.strategy = strategy
        self.masking = masking or MaskingConfig.from_manifest(dataset.manifest)
        self.seed = seed
        self.pad_token_id = int(pad_token_id)

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = collate_sequences(samples, self.pad_token_id)
        masked = apply_masking(batch, self.strategy, self.masking, seed=self.seed, epoch=self.dataset.epoch)
        return {name: masked[name] for name in MODEL_INPUTS}


def concat_rows(parts: Sequence[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Rows of several collated batches as one, padded to the widest (collate_sequences' padding)."""
    width = max(part["input_ids"].shape[1] for part in parts)
    out = {}
    for name in parts[0]:
        tensors = [part[name] for part in parts]
        if tensors[0].dim() == 2:
            pad = PADDED_COLUMNS[name][1] if name in PADDED_COLUMNS else 0
            pad = pad_token_id if pad is None else pad
            tensors = [t if t.shape[1] == width else torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad)
                       for t in tensors]
        out[name] = torch.cat(tensors)
    return out


class MixtureRows(IterableDataset):
    """A `Mixture`'s rows one at a time, in the draw's order (batch it again with the mixture's
    batch size, so that the Trainer's batches are the mixture's)."""

    def __init__(self, mixture: Mixture) -> None:
        super().__init__()
        self.mixture = mixture

    def __iter__(self):
        for batch in self.mixture:
            for row in range(len(batch["sample_index"])):
                yield {name: column[row] for name, column in batch.items()}


class MixtureCollator:
    """A `data_collator` for `MixtureRows`: pads the rows and masks each with its source's strategy
    (the mixture's: the domain's `--strategy`, each other source's own)."""

    def __init__(self, mixture: Mixture, masking: MaskingConfig | None = None, seed: int | None = None) -> None:
        self.mixture = mixture
        self.masking = masking or MaskingConfig.from_manifest(mixture.sources[0].dataset.manifest)
        self.seed = mixture.seed if seed is None else seed

    def __call__(self, rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = concat_rows([{name: value.unsqueeze(0) for name, value in row.items()} for row in rows],
                            self.mixture.pad_token_id)
        masked = mask_by_source(batch, self.mixture.strategies, self.masking, seed=self.seed)
        return {name: masked[name] for name in MODEL_INPUTS}

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
        check_strategy(strategy)
        if strategy in PEER_SIGNAL_STRATEGIES and mask_map.peer_signals is None:
            raise PeerSignalsMissing(f"{strategy} reads the version's peer signals, and this map has none: build the "
                                     "version with `maskstream build --peer-signals` (and export it again)")
        if tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path} has no pad token: set one before collating")
        mask_map.check_tokenizer(tokenizer, allow_other_tokenizer)
        self.mask_map = mask_map
        self.tokenizer = tokenizer
        self.strategy = strategy
        self.max_length = max_length or int(mask_map.settings.max_length)
        self.masking = masking or MaskingConfig.from_tokenizer(tokenizer, budget=float(mask_map.settings.budget))
        self.seed = seed
        self.text_column = text_column
        self.pad_to_multiple_of = pad_to_multiple_of
        # The tokens a tokenizer adds around or between texts; [UNK] stands for text, as in the build.
        self.special_ids = np.array(sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}), np.int64)
        self.encoder = TextEncoder(tokenizer, self.max_length)
        self.epoch = 0
        self.rows_seen = 0  # rows this copy numbered itself (per loader worker)
        self.rows_without_words = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, rows: Sequence[Any]) -> dict[str, torch.Tensor]:
        if not len(rows):
            raise ValueError("cannot collate an empty batch")
        texts, ids, offsets, special = self.encoded(rows)
        samples = text_samples(texts, ids, offsets, special, self.sample_indices(rows), mask_map=self.mask_map,
                               width=self.max_length, peer_columns=peer_columns(self.strategy))
        batch = collate_sequences(samples, int(self.tokenizer.pad_token_id), self.pad_to_multiple_of)
        masked = apply_masking(batch, self.strategy, self.masking, seed=self.seed, epoch=self.epoch)
        return {name: masked[name] for name in MODEL_INPUTS}

    def sample_indices(self, rows: Sequence[Any]) -> list[int]:
        """Each row's `sample_index`, or this copy's own numbering (interleaved across loader workers and
        ranks, so that no two copies give a number twice)."""
        world = World.detect()
        out = []
        for row in rows:
            if isinstance(row, Mapping) and "sample_index" in row:
                out.append(int(row["sample_index"]))
            else:
                out.append((self.rows_seen * world.workers + world.worker) * world.world_size + world.rank)
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
            for i, row_ids, row_offsets, row_special in zip(raw, *self.encoder.encode([texts[i] for i in raw]),
                                                             strict=True):
                ids[i], offsets[i], special[i] = row_ids, row_offsets, row_special
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

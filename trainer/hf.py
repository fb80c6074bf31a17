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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset

from maskstream.schemas.manifest import load_manifest, safe_relative_path
from maskstream.trainer.collate import PADDED_COLUMNS, collate_sequences
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.masking import STRATEGIES, MaskingConfig, apply_masking
from maskstream.trainer.mixture import Mixture, mask_by_source

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
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown masking strategy {strategy!r}; choose one of {tuple(STRATEGIES)}")
        pad_token_id = dataset.manifest.tokenizer.get("pad_token_id")
        if pad_token_id is None:
            raise ValueError(f"manifest tokenizer entry lacks pad_token_id; it has {sorted(dataset.manifest.tokenizer)}")
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

"""The training DataLoader: streamed rows -> padded batches -> masks (in workers, or later on device).

`build_dataloader` returns a `torch.utils.data.DataLoader` whose batches are dicts of tensors
(`maskstream.trainer.collate.collate_sequences`), masked by `maskstream.trainer.masking.apply_masking` inside the
workers (`mask_in_workers=True`: `maskstream train` on CPU and GPU) or left unmasked for the caller to mask on the device
after the transfer:

    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    batch = apply_masking(batch, strategy, masking, seed=seed, epoch=dataset.epoch)

Either way the masks are the same (they are a function of seed, epoch, sample index and the batch's
padded width). A batch masked
in the workers also carries `masked_positions`: the flat indices of its masked tokens, so that the
training step selects them with a shape the host knows instead of waiting for the device.

Held-out rows (`held_out_fraction`, `maskstream train`) leave in the workers, before collation: the
batch the DataLoader pins is the one the training loop moves to the device, untouched (a copy in the
training process would be pageable memory, and its transfer synchronous). Such a batch carries
`rows_read`, a plain int: the rows of the loader's order it stands for, its held-out ones included
(what the position and the plan count). A batch whose rows were all held out is `{"rows_read": n}`.

Saving and resuming: the loader counts the samples of every batch it hands out into its
dataset, so `dataset.state_dict()` between two steps is the loader's state; after
`dataset.load_state_dict(state)` the next iteration of a loader built with the same
`batch_size` and `num_workers` continues with exactly the batches that would have come next.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.held_out import held_out
from maskstream.trainer.masking import MaskingConfig, apply_masking
from maskstream.trainer.position import SharedCounts
from maskstream.trainer.strategies import check_strategy

ROWS_READ = "rows_read"  # a batch's rows of the loader's order, held-out ones included (an int)
MASKED_POSITIONS = "masked_positions"  # flat indices (row * width + column) of a batch's masked tokens


def masked_positions(labels: torch.Tensor) -> torch.Tensor:
    """The flat indices of the masked tokens (`labels` != -100), in row-major order: what
    `labels[labels != -100]` selects. Made where the batch is masked, on the CPU."""
    return (labels.reshape(-1) != -100).nonzero().squeeze(1)


def _collate_and_mask(
    samples: list[dict[str, Any]],
    *,
    pad_token_id: int,
    strategy: str | None,
    masking: MaskingConfig | None,
    seed: int,
    counts: SharedCounts,
    held_out_fraction: float | None,
) -> dict[str, Any]:
    rows_read, longest = len(samples), max(len(sample["input_ids"]) for sample in samples)
    if held_out_fraction:  # masks are per row (seed, epoch, index, width): dropping rows first changes none
        held = held_out(np.array([int(s["sample_index"]) for s in samples]), held_out_fraction)
        samples = [sample for sample, out in zip(samples, held, strict=True) if not out]
        if not samples:
            return {ROWS_READ: rows_read}
    batch: dict[str, Any] = collate_sequences(samples, pad_token_id, longest=longest)
    if strategy is not None:
        batch = apply_masking(batch, strategy, masking, seed=seed, epoch=counts.snapshot.epoch)
        batch[MASKED_POSITIONS] = masked_positions(batch["labels"])
    if held_out_fraction is not None:
        batch[ROWS_READ] = rows_read
    return batch


def rows_read(batch: dict[str, Any] | list[dict[str, Any]]) -> int:
    """The rows of the loader's order that `batch` stands for (held-out rows dropped from it included)."""
    if isinstance(batch, list):
        return len(batch)
    return batch[ROWS_READ] if ROWS_READ in batch else len(batch["sample_index"])


def samples_as_read(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `collate_fn` of `build_dataloader(collate=False)`: the batch's samples, uncollated."""
    return samples


class StreamingDataLoader(DataLoader):
    """A DataLoader that records, in its dataset, how many samples it has handed out."""

    dataset: StreamingSequenceDataset

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self.dataset.begin_iteration()
        for batch in super().__iter__():
            self.dataset.count_consumed(rows_read(batch))
            yield batch


def build_dataloader(
    dataset: StreamingSequenceDataset,
    *,
    batch_size: int,
    num_workers: int = 0,
    strategy: str | None,
    masking: MaskingConfig | None,
    seed: int = 0,
    mask_in_workers: bool = True,
    pin_memory: bool = False,
    prefetch_factor: int = 2,
    generator: torch.Generator | None = None,
    collate: bool = True,
    held_out_fraction: float | None = None,
) -> DataLoader:
    """Batches of `dataset`, masked with `strategy` in the workers when `mask_in_workers` (else
    unmasked: run `apply_masking` on the device). `strategy=None` never masks. `collate=False`
    hands out each batch's samples as a list instead, for a caller that draws rows from several
    loaders (`maskstream.trainer.mixture`). A `generator` gives the workers' base seed (they draw
    nothing from it) instead of the global generator: a mixture's loaders start at any step without
    moving the model's random state.

    batch_size: samples per batch on this rank. num_workers: DataLoader worker processes (0: in this
    process; the dataset splits its rows between them). masking and seed: the MaskingConfig and the
    seed of `apply_masking`. pin_memory: page-locked batches, for a fast copy to a GPU.
    prefetch_factor: batches each worker keeps ready (with num_workers > 0). held_out_fraction: drop
    the rows `maskstream.trainer.held_out.held_out` holds out before collation, and give each batch
    `rows_read` (None: keep every row, no `rows_read`)."""
    if strategy is not None:
        check_strategy(strategy)
    if strategy is not None and masking is None:
        raise ValueError("a masking strategy needs a MaskingConfig")
    pad_token_id = dataset.manifest.tokenizer.get("pad_token_id")
    if pad_token_id is None:
        raise ValueError(f"manifest tokenizer entry lacks pad_token_id; it has {sorted(dataset.manifest.tokenizer)}")
    dataset.batch_size = batch_size
    dataset.num_workers = num_workers
    collate_and_mask = functools.partial(
        _collate_and_mask,
        pad_token_id=int(pad_token_id),
        strategy=strategy if mask_in_workers else None,
        masking=masking,
        seed=seed,
        # Collation reads the epoch of the iteration it belongs to.
        counts=dataset.counts,
        held_out_fraction=held_out_fraction,
    )
    return StreamingDataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_and_mask if collate else samples_as_read,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        persistent_workers=num_workers > 0,
        drop_last=False,
        generator=generator,
    )


def loader_generator() -> torch.Generator:
    """The generator of a mixture source's DataLoader: starting one (at any source's epoch boundary,
    or all at once after a resume) then leaves the global random state, the model's dropout, alone.
    Its draws seed only the workers' own generators, which the readers do not use."""
    return torch.Generator().manual_seed(0)

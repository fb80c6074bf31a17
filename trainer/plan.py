"""How long a run trains, in samples: the plan `maskstream train` makes at its start and works out
again when it resumes on another layout.

A *sample* is a row the loader deals, all ranks together, held-out rows included (they are dealt,
then dropped from the batch) and the remainder policy's repeats included (each rank of a layout
deals `ceil(rows / ranks)` rows an epoch, wrapping around the epoch's order). Every rank deals the
same number of rows in each batch, so a step trains `ranks x rows of its batches` samples.

- `--epochs E` ends where E epochs end: the batches left of the current epoch on this layout,
  the whole epochs after it, and a fraction of one for a fractional E. A resume on another world
  size or batch size works that out again from the loader's position, so the epoch that was under
  way when the run stopped is finished on the new layout, however its rows divide.
- A `--mix` mixture's epochs are its domain's: its batches are always full, each rank takes the
  domain rows the draw gives it (maskstream.trainer.mixture), and the run ends at the batch where
  every rank has taken its share of E domain epochs (the others have taken a few rows more).
- `--max-steps N` ends after N steps, on any layout: an elastic resume says how many samples the
  remaining steps now cover.
- The learning rate (linear warm-up, then linear decay to 0) and the masking-budget schedule are
  functions of the samples trained out of the samples planned, so a resume on another layout
  continues the schedule where it was and ends it where the run ends.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from maskstream.trainer.world import rows_per_rank


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a run trains: it ends at step `total_steps`, after `total_samples` samples; the
    learning rate warms up over the first `warmup_samples` (the first `warmup_steps` steps of
    the layout the run started on)."""

    total_steps: int
    warmup_steps: int
    total_samples: int
    warmup_samples: int

    def record(self) -> dict[str, int]:
        """The plan's fields, as the run's settings (checkpoints, summary.json) record them."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class EpochProgress:
    """Where a rank's loader is, and how it deals: what the plan is worked out from."""

    epoch: int
    rows_left: int  # rows this rank still deals in the current epoch
    batches_left: int  # its batches left in the current epoch
    rows_per_epoch: int  # rows this rank deals in a whole epoch: ceil(version rows / ranks)
    batch_size: int
    world_size: int
    # A mixture: which of `count` mixture samples from `start` on are the domain's (the draw), and the
    # mixture samples taken before this position; None for a single source.
    domain_rows: Callable[[int, int], np.ndarray] | None = None
    samples_done: int = 0

    @classmethod
    def of(cls, dataset: Any, batch_size: int, world_size: int) -> EpochProgress:
        """The position of a `StreamingSequenceDataset` (after `load_state_dict`, if resuming)."""
        position = dataset.position()
        rows_now = dataset.rows_per_rank()
        return cls(epoch=position.epoch, rows_left=max(rows_now - position.samples_consumed, 0),
                   batches_left=max(math.ceil(rows_now / batch_size) - position.batches_consumed, 0),
                   rows_per_epoch=rows_per_rank(dataset.total_rows, world_size), batch_size=batch_size,
                   world_size=world_size)

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(self.rows_per_epoch / self.batch_size)

    def batch_rows(self) -> Iterator[int]:
        """The rows of each of this rank's next batches: the rest of this epoch, then whole epochs (a
        mixture's batches are full)."""
        rows_left, batch = self.rows_left, self.batch_size
        while self.domain_rows is not None:
            yield batch
        while True:
            while rows_left > 0:
                yield min(batch, rows_left)
                rows_left -= batch
            rows_left = self.rows_per_epoch

    def samples_of(self, batches: int) -> int:
        """Samples (all ranks) of the next `batches` batches of every rank."""
        rows, iterator = 0, self.batch_rows()
        for _ in range(batches):
            rows += next(iterator)
        return rows * self.world_size

    def batches_until(self, epochs: float) -> int:
        """Batches of each rank from here to where `epochs` epochs end (0 if past it)."""
        if self.domain_rows is not None:
            return self._mixture_batches_until(epochs)
        whole, fraction = divmod(epochs, 1.0)
        end_epoch, end_batch = int(whole), math.floor(fraction * self.batches_per_epoch)
        if self.epoch > end_epoch or (self.epoch == end_epoch and end_batch == 0):
            return 0
        done_now = self.batches_per_epoch - self.batches_left  # of the current epoch, in this layout's batches
        if self.epoch == end_epoch:
            return max(end_batch - done_now, 0)
        return self.batches_left + (end_epoch - self.epoch - 1) * self.batches_per_epoch + end_batch

    def rows_until(self, epochs: float) -> int:
        """Rows this rank deals from here to where `epochs` epochs end (0 if past it)."""
        whole, fraction = divmod(epochs, 1.0)
        end_epoch, end_rows = int(whole), math.floor(fraction * self.rows_per_epoch)
        if self.epoch > end_epoch:
            return 0
        if self.epoch == end_epoch:
            return max(end_rows - (self.rows_per_epoch - self.rows_left), 0)
        return self.rows_left + (end_epoch - self.epoch - 1) * self.rows_per_epoch + end_rows

    def _mixture_batches_until(self, epochs: float) -> int:
        """A mixture's batches until every rank has taken the domain rows that end `epochs`: batch `t`
        of rank `r` takes mixture samples from `samples_done + (t x ranks + r) x batch` on."""
        needed = self.rows_until(epochs)
        if needed <= 0:
            return 0
        ranks, batch = self.world_size, self.batch_size
        taken, batches = np.zeros(ranks, dtype=np.int64), 0
        chunk = max(16, math.ceil(needed / batch))  # batches drawn at a time: at least the domain's share
        while True:
            start = self.samples_done + batches * ranks * batch
            domain = self.domain_rows(start, chunk * ranks * batch).reshape(chunk, ranks, batch).sum(axis=2)
            reached = ((taken + np.cumsum(domain, axis=0)) >= needed).all(axis=1)
            if reached.any():
                return batches + int(np.argmax(reached)) + 1
            taken += domain.sum(axis=0)
            batches += chunk


def fresh_plan(progress: EpochProgress, *, epochs: float, max_steps: int, grad_accumulation: int,
               warmup_ratio: float) -> Plan:
    """The plan of a run that starts at `progress`: --max-steps, else the steps that end --epochs
    (the last step may take a few batches of the next epoch when accumulation does not divide)."""
    batches = progress.batches_until(epochs)
    total_steps = max_steps or max(1, math.ceil(batches / grad_accumulation))
    warmup_steps = math.ceil(warmup_ratio * total_steps)
    return Plan(total_steps, warmup_steps, progress.samples_of(total_steps * grad_accumulation),
                progress.samples_of(warmup_steps * grad_accumulation))


def replan(saved: Plan, step: int, samples_done: int, progress: EpochProgress, *, epochs: float | None,
           grad_accumulation: int) -> Plan:
    """The plan of a run resumed at `step`, `samples_done` trained, on another layout now at
    `progress`: the steps that end its epochs on this layout (or its steps, for a run planned in
    steps: `epochs` None), and the samples they cover."""
    if epochs is None:
        steps_left = saved.total_steps - step
    else:
        steps_left = math.ceil(progress.batches_until(epochs) / grad_accumulation)
    return dataclasses.replace(saved, total_steps=step + steps_left,
                               total_samples=samples_done + progress.samples_of(steps_left * grad_accumulation))


def learning_rate_factor(samples_done: int, plan: Plan) -> float:
    """transformers' `get_linear_schedule_with_warmup` in samples: a linear warm-up from 0 over the
    warm-up samples, then a linear decay to 0 at the planned samples. With batches of equal rows it
    is the same number as the step schedule (the same ratio of integers, rounded once)."""
    if samples_done < plan.warmup_samples:
        return float(samples_done) / float(max(1, plan.warmup_samples))
    return max(0.0, float(plan.total_samples - samples_done) / float(max(1, plan.total_samples - plan.warmup_samples)))

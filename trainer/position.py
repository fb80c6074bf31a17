"""Where a reader is in its data, typed: the state a maskstream version's dataset or a text source saves
and resumes from, and the counts its DataLoader workers read.

- `Layout`: ranks, DataLoader workers per rank and rows per batch: how an epoch's order is dealt.
- `Segment`: an earlier layout of the current epoch (an elastic resume) and what it took.
- `Pending`: a newer version a followed source moves on to once an epoch is finished.
- `DatasetPosition`, `TextPosition`: a rank's position in a maskstream version, in a text source.
- `SharedCounts`: epoch, samples, batches and resumes of the current epoch, in shared memory.

A state travels as JSON in a checkpoint: `state_dict()` returns a position's `to_dict()`, and `of()`
reads one back, states written before this module included (a key an older release did not write
reads as empty: no segments, nothing ahead). tests/trainer/test_loader_states.py resumes states
recorded before it existed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch


@dataclasses.dataclass(frozen=True)
class Layout:
    """How an epoch's order is dealt: ranks, DataLoader workers per rank (0 reads in the training
    process, like one worker), rows per batch."""

    world_size: int
    num_workers: int
    batch_size: int

    @property
    def readers(self) -> int:
        return max(self.num_workers, 1)

    @property
    def reading(self) -> tuple[int, int, int]:
        """What decides which rows each batch holds: 0 workers and 1 read alike (one reader)."""
        return self.world_size, self.readers, self.batch_size


@dataclasses.dataclass(frozen=True)
class Segment:
    """An earlier layout of an epoch and what it took: `batches` on every rank (a dataset's elastic
    resume, its ranks took the same steps), or `rows` on each rank, -1 for its whole share (a
    mixture's ranks take their own counts of each source)."""

    layout: Layout
    batches: int | None = None
    rows: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        taken = {"batches": self.batches} if self.rows is None else {"rows": list(self.rows)}
        return {"world_size": self.layout.world_size, "num_workers": self.layout.num_workers,
                "batch_size": self.layout.batch_size, **taken}

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> Segment:
        layout = Layout(int(state["world_size"]), int(state["num_workers"]), int(state["batch_size"]))
        if "rows" in state:
            return cls(layout, rows=tuple(int(r) for r in state["rows"]))
        return cls(layout, batches=int(state["batches"]))


# Segments announced for later epochs, by epoch: a mixture's ranks that had gone past the epoch being
# resumed had taken rows of the next (maskstream.trainer.mixture.elastic_state).
Ahead = dict[int, list[Segment]]


def segments_of(states: Any) -> list[Segment]:
    return [Segment.of(state) for state in states or []]


def ahead_of(state: Mapping[str, Any]) -> Ahead:
    """A state's `ahead`: JSON, so its epochs are strings."""
    return {int(epoch): segments_of(later) for epoch, later in (state.get("ahead") or {}).items()}


def ahead_to_dict(ahead: Ahead) -> dict[str, list[dict[str, Any]]]:
    return {str(epoch): [segment.to_dict() for segment in later] for epoch, later in ahead.items()}


def announced(ahead: Ahead, epoch: int) -> tuple[list[Segment], Ahead]:
    """The segments `ahead` announced for `epoch` (elastic resumes it starts with), and those of the
    epochs after it."""
    return list(ahead.get(epoch, [])), {e: later for e, later in ahead.items() if e > epoch}


@dataclasses.dataclass(frozen=True)
class Pending:
    """A newer version of a followed source (`--follow-latest`), read once the rank has finished
    epoch `after_epoch`."""

    url: str
    after_epoch: int

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "after_epoch": self.after_epoch}

    @classmethod
    def of(cls, state: Mapping[str, Any] | None) -> Pending | None:
        return None if not state else cls(str(state["url"]), int(state["after_epoch"]))


@dataclasses.dataclass
class DatasetPosition:
    """A rank's position in a maskstream version: the epoch, the samples and batches of it this rank
    has handed out, the epoch's elastic resumes and those announced for later epochs, the layout it
    was read on, and what must match on resume (version, seed, shuffle, shuffle_buffer)."""

    epoch: int
    samples_consumed: int
    batches_consumed: int
    segments: list[Segment]
    ahead: Ahead
    version: str
    seed: int
    shuffle: bool
    shuffle_buffer: int
    rank: int
    world_size: int
    batch_size: int | None  # None: not in a loader yet
    num_workers: int

    @property
    def layout(self) -> Layout:
        return Layout(self.world_size, self.num_workers, self.batch_size or 1)

    @property
    def taken(self) -> int:
        """Rows of the epoch this rank has taken (of what was left of it, after an elastic resume)."""
        return self.samples_consumed

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "samples_consumed": self.samples_consumed,
                "batches_consumed": self.batches_consumed,
                "segments": [segment.to_dict() for segment in self.segments], "ahead": ahead_to_dict(self.ahead),
                "version": self.version, "seed": self.seed, "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer, "rank": self.rank, "world_size": self.world_size,
                "batch_size": self.batch_size, "num_workers": self.num_workers}

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> DatasetPosition:
        batch_size = state.get("batch_size")
        return cls(int(state["epoch"]), int(state["samples_consumed"]), int(state["batches_consumed"]),
                   segments_of(state.get("segments")), ahead_of(state), state["version"], int(state["seed"]),
                   bool(state["shuffle"]), int(state["shuffle_buffer"]), int(state.get("rank") or 0),
                   int(state["world_size"]), None if batch_size is None else int(batch_size),
                   int(state.get("num_workers") or 0))

    def resumed(self, layout: Layout, epoch: int, segments: list[Segment], ahead: Ahead) -> DatasetPosition:
        """The start of what is left of `epoch` on `layout`, after `segments` (an elastic resume)."""
        return dataclasses.replace(self, epoch=epoch, samples_consumed=0, batches_consumed=0, segments=segments,
                                   ahead=ahead, world_size=layout.world_size, num_workers=layout.num_workers,
                                   batch_size=layout.batch_size)


@dataclasses.dataclass
class TextPosition:
    """A rank's position in a text source: the epoch, the records of it this rank has taken, the
    epoch's elastic resumes and those announced for later epochs."""

    epoch: int
    records: int
    world_size: int
    url: str
    segments: list[Segment]
    ahead: Ahead

    @property
    def layout(self) -> Layout:
        return Layout(self.world_size, 0, 1)  # records are dealt one at a time, whatever the workers

    @property
    def taken(self) -> int:
        return self.records

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "records": self.records, "world_size": self.world_size, "url": self.url,
                "segments": [segment.to_dict() for segment in self.segments], "ahead": ahead_to_dict(self.ahead)}

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> TextPosition:
        return cls(int(state["epoch"]), int(state["records"]), int(state["world_size"]), state["url"],
                   segments_of(state.get("segments")), ahead_of(state))

    def resumed(self, layout: Layout, epoch: int, segments: list[Segment], ahead: Ahead) -> TextPosition:
        return dataclasses.replace(self, epoch=epoch, records=0, world_size=layout.world_size, segments=segments,
                                   ahead=ahead)


def position_of(state: Mapping[str, Any]) -> DatasetPosition | TextPosition:
    """A source's saved state, typed by its kind."""
    return DatasetPosition.of(state) if "samples_consumed" in state else TextPosition.of(state)


class Counts(NamedTuple):
    """A rank's place in its epoch: the epoch, the samples and batches of it handed out, and how many
    elastic resumes the epoch has had (which rest of the order is being read)."""

    epoch: int
    samples: int
    batches: int
    resumes: int


class SharedCounts:
    """`Counts` in a shared-memory tensor, so that persistent DataLoader workers see them: `live`, moved
    by the training process batch by batch, and `snapshot`, as they were when the loader last started
    an iteration (what its workers read: the live counts move while they start)."""

    def __init__(self) -> None:
        self.tensor = torch.zeros(2 * len(Counts._fields), dtype=torch.int64).share_memory_()

    @property
    def live(self) -> Counts:
        return Counts(*self.tensor[: len(Counts._fields)].tolist())

    @property
    def snapshot(self) -> Counts:
        return Counts(*self.tensor[len(Counts._fields) :].tolist())

    def set(self, counts: Counts) -> None:
        self.tensor[: len(Counts._fields)] = torch.tensor(counts)

    def take_snapshot(self) -> None:
        self.tensor[len(Counts._fields) :] = self.tensor[: len(Counts._fields)].clone()

    def count_batch(self, samples: int) -> None:
        self.tensor[1] += samples
        self.tensor[2] += 1

"""Stream a dataset version's shards (local or gs://) to a training process.

`StreamingSequenceDataset` is a `torch.utils.data.IterableDataset` over the rows of one dataset
version (a root's `latest` or a version folder). It reads through `manifest.json`, never lists
files, and never holds more than a shuffle window of rows in memory.

Contract (what each rank and worker reads), for epoch `e`, `T` rows, `W` ranks, batch size `B`:

1. *The global order*: every Parquet row group of every shard is a block. With `shuffle=True` the
   blocks are put in a random order drawn from `(seed, e)`; otherwise in manifest order.
   Concatenating them gives the epoch's order of `T` rows: a function of the seed and the epoch
   alone, the same for any number of ranks, workers and any batch size.
2. *Ranks*: every rank reads `n = ceil(T / W)` rows, rank `r` the positions `[r * n, (r + 1) * n)`
   of the order. **Remainder policy**: when `W` does not divide `T`, the order is padded by
   wrapping around to its start, so the first `W * n - T` (< W) rows of the epoch are read a
   second time, by the last rank. Every rank therefore takes the same number of steps,
   `ceil(n / B)`, and every row is read at least once per epoch (exactly once when `W` divides
   `T`).
3. *Windows and workers*: a rank's `n` rows are cut into consecutive windows of
   `shuffle_buffer` rows (rounded up to a multiple of `B`, and made small enough that every
   DataLoader worker gets one): strided slices of the rank's share, window `i` to worker
   `i % num_workers`. A worker reads its window as one slice per block it overlaps and yields its
   rows in a random order drawn from `(seed, e, window start)` (or in order with
   `shuffle=False`). Only the last window can hold a short batch; with several workers it can come
   before the end of the epoch. Memory is bounded by the window: at most `shuffle_buffer` decoded
   rows (+ one batch of rounding, + one record batch of READ_BATCH_ROWS being decoded) per
   worker, whatever the size of the dataset or of its row groups. Row groups of a few thousand
   rows shuffle best: a window that starts inside a large row group decodes it from its beginning.
4. Every yielded sample is a dict of the SEQUENCE_SCHEMA list columns (`input_ids`, `word_ids`,
   `word_index`, `special_tokens_mask`, `mask_probability`) as 1-D numpy arrays and
   `sample_index`, the row's position in the version (shards in manifest order): the key of the
   sample's masks (see `maskstream.trainer.masking`).

Checks: the manifest's schema version (`Manifest.from_json`); each shard's Arrow schema and row
count when its footer is read (at construction); each shard's sha256, streamed, the first time a
process reads the shard (`verify_checksums=False` turns it off). Failures name the shard.

Local cache (`cache=ShardCache(folder, limit_bytes)`, `maskstream.trainer.shard_cache`): shards are
read from the cache, downloaded into it (checked by sha256 as they are written) the first time, and
the next shards a worker will read are downloaded ahead on a background thread; the least recently
used are evicted so that the cache stays within its limit. The footers are still read from the
version at construction; a second epoch over a cached dataset reads no shard bytes from the bucket.

State and resume: the position (`position()`, a `maskstream.trainer.position.DatasetPosition`;
`state_dict()` is its JSON) is the number of samples and batches of the current epoch that the
training loop has received on this rank. The DataLoader of `maskstream.trainer.loader.build_dataloader`
counts every batch it hands out into its dataset, so `dataset.state_dict()` taken between two
steps is exact, and the same on every rank but the sample count of a short last batch (every rank
takes the same steps). `load_state_dict(state)` on a dataset of the same version, seed and
`shuffle_buffer` continues the epoch:

- *Same world size, batch size and worker count*: exactly the batches an uninterrupted run would
  have yielded next (mid-epoch too): whole windows before the position are skipped without being
  read, and the DataLoader's round robin over workers is rotated to resume where it stopped.
- *Any other world size, batch size or worker count* (elastic resume; any rank's state will do, as
  they agree on the batches taken): the rows the saved layout had already yielded are worked out
  from it (which windows each of its ranks' workers had read, and how far into the last one), and
  the rest of the epoch, in the global order, is dealt to the new ranks and workers by points 2
  and 3 as if it were the whole epoch (its windows' order drawn from `(seed, e, resume number,
  window start)`). Across the resume, every row of the epoch is yielded exactly once, but for the
  remainder policy's repeats, which each layout applies to what it deals. A state may record
  several such resumes in one epoch (`segments`); the next epoch starts whole again, but for
  segments a state announces for later epochs (`ahead`: a mixture's ranks take their own number of
  rows of each source, recorded as `rows` per rank, and some may have started the next epoch).

Iterating the loader always continues from the dataset's position. `set_epoch(e)` with a
different epoch starts `e` from its beginning; with the current epoch it keeps the position (so a
trainer may call it after `load_state_dict`; a finished epoch then yields nothing). Iterating a
finished epoch without calling `set_epoch` starts the next epoch, so step-based loops that just
iterate the loader again need no epoch bookkeeping.
The epoch and position live in shared memory (`SharedCounts`), so persistent workers see them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import IterableDataset

from maskstream.mask_signal.peer_lookup import PeerSignals
from maskstream.schemas.manifest import ManifestError, load_manifest, safe_relative_path, sha256_file
from maskstream.schemas.tables import SEQUENCE_SCHEMA, check_schema
from maskstream.storage.retry import retry_read
from maskstream.trainer.position import (
    Ahead,
    Counts,
    DatasetPosition,
    Layout,
    Segment,
    SharedCounts,
    announced,
)
from maskstream.trainer.shard_cache import ChecksumMismatch, ShardCache
from maskstream.trainer.world import World, rows_per_rank

__all__ = ["ChecksumMismatch", "StreamingSequenceDataset"]

LIST_COLUMNS = ("input_ids", "word_ids", "word_index", "special_tokens_mask", "mask_probability")
# What is read, cast to the contract (so that writers differing only in nullability still concat).
READ_SCHEMA = pa.schema([SEQUENCE_SCHEMA.field(name) for name in LIST_COLUMNS])
READ_BATCH_ROWS = 1024  # rows decoded at a time within a row group


@dataclasses.dataclass(frozen=True)
class Block:
    """One row group: the unit of shuffling and reading."""

    shard: int
    row_group: int
    rows: int
    first_row: int  # sample index of its first row


def _read_metadata(url: str) -> pq.FileMetaData:
    with fsspec.open(url, "rb") as f:
        return pq.ParquetFile(f).metadata


def round_robin_counts(batches: list[int], consumed: int) -> tuple[list[int], int]:
    """How many batches each worker has delivered after `consumed` batches of a DataLoader that
    takes one batch from each worker in turn, skipping exhausted ones; and the worker whose batch
    comes next."""
    delivered = [0] * len(batches)
    turn = 0
    for _ in range(min(consumed, sum(batches))):
        while delivered[turn] >= batches[turn]:
            turn = (turn + 1) % len(batches)
        delivered[turn] += 1
        turn = (turn + 1) % len(batches)
    return delivered, turn


@dataclasses.dataclass(frozen=True)
class RankPlan:
    """One rank's share of an order (contract points 2 and 3): its windows as [start, stop) order
    indices, the logical worker of each, and each worker's batches."""

    windows: list[tuple[int, int]]
    owners: list[int]
    batches: list[int]

    @classmethod
    def of(cls, layout: Layout, rank: int, order_length: int, shuffle_buffer: int) -> RankPlan:
        rows = rows_per_rank(order_length, layout.world_size)
        batch = layout.batch_size
        size = max(batch, math.ceil(min(shuffle_buffer, math.ceil(rows / layout.readers)) / batch) * batch)
        first, last = rank * rows, (rank + 1) * rows
        windows = [(s, min(s + size, last)) for s in range(first, last, size)]
        owners = [i % layout.readers for i in range(len(windows))]
        batches = [0] * layout.readers
        for (start, stop), owner in zip(windows, owners, strict=True):
            batches[owner] += math.ceil((stop - start) / batch)
        return cls(windows, owners, batches)

    def worker_windows(self, worker: int) -> list[tuple[int, int]]:
        return [w for w, owner in zip(self.windows, self.owners, strict=True) if owner == worker]

    def taken_by_worker(self, batch_size: int, *, batches: int | None = None, rows: int | None = None) -> list[int]:
        """Rows each worker had yielded once the DataLoader's round robin (a batch from each worker
        in turn, skipping exhausted ones) had handed out `batches` batches, or `rows` rows (the last
        batch partly; -1: all of them). A worker's batches are full but its last, which may come
        before other workers are done."""
        totals = [sum(stop - start for start, stop in self.worker_windows(w)) for w in range(len(self.batches))]
        if batches is not None:
            delivered, _ = round_robin_counts(self.batches, batches)
            return [min(count * batch_size, total) for count, total in zip(delivered, totals, strict=True)]
        if rows < 0:
            return totals
        taken, delivered, turn = [0] * len(totals), [0] * len(totals), 0
        while rows > 0 and sum(delivered) < sum(self.batches):
            while delivered[turn] >= self.batches[turn]:
                turn = (turn + 1) % len(totals)
            take = min(batch_size, totals[turn] - taken[turn], rows)
            taken[turn], delivered[turn], rows = taken[turn] + take, delivered[turn] + 1, rows - take
            turn = (turn + 1) % len(totals)
        return taken


class StreamingSequenceDataset(IterableDataset):
    """Rows of a dataset version split across ranks and workers (module doc). dataset: root or version folder,
    local or gs://; seed: the order's; shuffle: seeded global order, else dataset order; shuffle_buffer: rows
    shuffled together; verify_checksums: sha256 checked as read; rank, world_size; cache: a ShardCache;
    peer_columns: peer-signal columns each sample also gets (of `span_ids`, `informativeness`:
    maskstream.mask_signal.peer_lookup; `maskstream.trainer.strategies.peer_columns(strategy)` names
    those a strategy reads)."""

    def __init__(
        self,
        dataset: str,
        *,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_buffer: int = 10_000,
        verify_checksums: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        cache: ShardCache | None = None,
        peer_columns: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.version_url, self.manifest = load_manifest(dataset)
        self.peer_columns = tuple(peer_columns)
        self.peer_signals = PeerSignals.load(self.version_url, self.manifest) if self.peer_columns else None
        self.seed = seed
        self.shuffle = shuffle
        if shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1, got {shuffle_buffer}")
        self.shuffle_buffer = shuffle_buffer
        self.verify_checksums = verify_checksums
        self.cache = cache
        world = World.detect(rank, world_size)
        self.rank, self.world_size = world.rank, world.world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, {self.world_size})")
        self.batch_size: int | None = None  # set by build_dataloader: windows align to batches
        self.num_workers = 0  # set by build_dataloader: checked on resume
        self.blocks = self._read_footers()
        self.total_rows = self.manifest.total_rows
        if self.total_rows == 0:
            raise ManifestError(f"{self.version_url} holds no rows")
        # This rank's place in the epoch, shared with (persistent) workers, which read its snapshot.
        self.counts = SharedCounts()
        # Earlier layouts of this epoch (elastic resumes) with the batches each took, and the rest
        # of the epoch's order they left (positions in the order; None: the whole order).
        self._segments: list[Segment] = []
        self._rest: np.ndarray | None = None
        self._rest_epoch = -1  # the epoch `_rest` belongs to
        # Segments of later epochs, applied when each starts: a mixture's ranks that had gone past the
        # epoch being resumed had taken rows of the next (maskstream.trainer.mixture).
        self._ahead: Ahead = {}
        self._saved: DatasetPosition | None = None  # a state to resume once the loader's layout is known
        self._verified: set[int] = set()
        self._epoch_pinned = False  # set_epoch chose the epoch the next iteration reads
        self._open: tuple[int, pq.ParquetFile, Any] | None = None
        self._starts: tuple[int, list[Block], np.ndarray] | None = None  # the block order's offsets, by epoch

    # ----------------------------------------------------------------------------- layout
    def shard_url(self, shard: int) -> str:
        return f"{self.version_url}/{safe_relative_path(self.manifest.shards[shard].path)}"

    def _read_footers(self) -> list[Block]:
        blocks = []
        first_row = 0
        for index, entry in enumerate(self.manifest.shards):
            url = self.shard_url(index)
            try:
                metadata = retry_read(functools.partial(_read_metadata, url), url)
                schema = metadata.schema.to_arrow_schema()
            except (OSError, pa.ArrowException) as e:
                raise ManifestError(f"shard {entry.path} of {self.version_url} cannot be read: {e}") from e
            check_schema(schema, SEQUENCE_SCHEMA, f"shard {entry.path}")
            if metadata.num_rows != entry.rows:
                raise ManifestError(
                    f"shard {entry.path} holds {metadata.num_rows} rows, the manifest says {entry.rows}"
                )
            for group in range(metadata.num_row_groups):
                rows = metadata.row_group(group).num_rows
                blocks.append(Block(index, group, rows, first_row))
                first_row += rows
        return blocks

    @property
    def epoch(self) -> int:
        return self.counts.live.epoch

    @property
    def layout(self) -> Layout:
        return Layout(self.world_size, self.num_workers, self.batch_size or 1)

    def _order_length(self) -> int:
        return self.total_rows if self._rest is None else len(self._rest)

    def rows_per_rank(self) -> int:
        """Rows this rank reads in the current epoch (what is left of it after an elastic resume)."""
        return rows_per_rank(self._order_length(), self.world_size)

    def steps_per_epoch(self, batch_size: int) -> int:
        """Batches per whole epoch on every rank (the same on all ranks)."""
        return math.ceil(rows_per_rank(self.total_rows, self.world_size) / batch_size)

    def __len__(self) -> int:
        return self.rows_per_rank()

    def _block_order(self, epoch: int) -> list[Block]:
        if not self.shuffle:
            return self.blocks
        order = np.random.default_rng([self.seed, epoch, 0xB10C]).permutation(len(self.blocks))
        return [self.blocks[i] for i in order]

    def _window_order(self, epoch: int, segment: int, start: int, count: int) -> np.ndarray:
        """The order a window's rows are yielded in (contract point 3)."""
        if not self.shuffle:
            return np.arange(count)
        key = [self.seed, epoch, start, 0x5EED] if segment == 0 else [self.seed, epoch, segment, start, 0x5EED]
        return np.random.default_rng(key).permutation(count)

    def _positions(self, rest: np.ndarray | None, start: int, stop: int) -> np.ndarray:
        """Positions in the epoch's order of indices [start, stop) of `rest` (None: the whole order),
        wrapping around its end (the remainder padding)."""
        index = np.arange(start, stop, dtype=np.int64) % (self.total_rows if rest is None else len(rest))
        return index if rest is None else rest[index]

    def _pieces(self, epoch: int, positions: np.ndarray) -> list[tuple[Block, int, int, np.ndarray | None]]:
        """(block, lo, hi, rows) reads covering `positions` of the epoch's order, in their order:
        rows [lo, hi) of the block, of which `rows` (relative to lo) when not all of them."""
        if self._starts is None or self._starts[0] != epoch:
            order = self._block_order(epoch)
            self._starts = (epoch, order, np.cumsum([0] + [block.rows for block in order]))
        _, order, starts = self._starts
        which = np.searchsorted(starts, positions, side="right") - 1
        cuts = np.flatnonzero((np.diff(which) != 0) | (np.diff(positions) <= 0)) + 1
        pieces = []
        for lo_index, hi_index in zip([0, *cuts], [*cuts, len(positions)], strict=True):
            rows = positions[lo_index:hi_index] - starts[which[lo_index]]
            lo, hi = int(rows[0]), int(rows[-1]) + 1
            pieces.append((order[which[lo_index]], lo, hi, None if hi - lo == len(rows) else rows - lo))
        return pieces

    # ----------------------------------------------------------------------------- state
    def set_epoch(self, epoch: int) -> None:
        """The next iteration reads `epoch`: from its beginning, or from the current position if
        `epoch` is already the current epoch (e.g. after `load_state_dict`)."""
        self._resolve_saved()
        if epoch != self.epoch:
            self._start_epoch(epoch)
        self._epoch_pinned = True
        # Workers read the snapshot; DataLoaders other than ours (transformers.Trainer's) never call
        # begin_iteration, which otherwise refreshes it.
        self.counts.take_snapshot()

    def _start_epoch(self, epoch: int) -> None:
        segments, self._ahead = announced(self._ahead, epoch)
        self._set_segments(epoch, segments)
        self.counts.set(Counts(epoch, 0, 0, len(self._segments)))

    def _set_segments(self, epoch: int, segments: list[Segment]) -> None:
        self._segments, self._rest, self._rest_epoch = segments, None, epoch
        for index, segment in enumerate(segments):
            self._rest = self._rest_after(epoch, index, segment, self._rest)

    def _rest_of(self, epoch: int, segments: int) -> np.ndarray | None:
        """What is left of `epoch`'s order after its first `segments` elastic resumes (a persistent
        worker works out an epoch the main process started after the worker did)."""
        if not segments:
            return None
        if self._rest_epoch != epoch:
            self._set_segments(epoch, self._ahead.get(epoch, []))
        return self._rest

    def position(self) -> DatasetPosition:
        """Where this rank is: epoch and samples consumed, the layout, and what must match on resume."""
        if self._saved is not None:  # not resumed yet: it is still where the saved state is
            return self._saved
        live = self.counts.live
        return DatasetPosition(live.epoch, live.samples, live.batches, list(self._segments), dict(self._ahead),
                               self.manifest.version, self.seed, self.shuffle, self.shuffle_buffer, self.rank,
                               self.world_size, self.batch_size, self.num_workers)

    def state_dict(self) -> dict[str, Any]:
        """`position()` as a checkpoint holds it (JSON)."""
        return self.position().to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes from `state_dict()` of a run on the same version with the same seed, shuffle and
        shuffle_buffer: exactly when the layout is the same, elastically otherwise (module doc). The
        layout is the loader's: the state is applied once `build_dataloader` has set it."""
        saved = DatasetPosition.of(state)
        mine = {"version": self.manifest.version, "seed": self.seed, "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer}
        different = {k: (getattr(saved, k), v) for k, v in mine.items() if getattr(saved, k) != v}
        if different:
            raise ValueError(f"cannot resume: saved vs current {different}")
        self._saved = saved
        if self.batch_size is not None:
            self._resolve_saved()

    def _resolve_saved(self) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        samples, batches, segments = saved.samples_consumed, saved.batches_consumed, list(saved.segments)
        self._ahead = dict(saved.ahead)
        if saved.layout.reading != self.layout.reading and batches > 0:
            segments.append(Segment(saved.layout, batches=batches))
            samples = batches = 0
        self._set_segments(saved.epoch, segments)
        self.counts.set(Counts(saved.epoch, samples, batches, len(segments)))

    def _rest_after(self, epoch: int, segment_index: int, segment: Segment, rest: np.ndarray | None) -> np.ndarray:
        """What is left of the epoch's order (positions, in order) after `segment`: the layout that
        dealt `rest` (None: the whole order) and what it took, as the batches every rank took or as
        `rows` taken on each rank (-1: its whole share; a mixture's ranks take their own counts)."""
        layout = segment.layout
        length = self.total_rows if rest is None else len(rest)
        taken = []
        for rank in range(layout.world_size):
            plan = RankPlan.of(layout, rank, length, self.shuffle_buffer)
            if segment.rows is not None:
                left_of = plan.taken_by_worker(layout.batch_size, rows=segment.rows[rank])
            else:
                left_of = plan.taken_by_worker(layout.batch_size, batches=segment.batches)
            for worker in range(layout.readers):
                left = left_of[worker]
                for start, stop in plan.worker_windows(worker):
                    if left <= 0:
                        break
                    count = min(left, stop - start)
                    taken.append(start + self._window_order(epoch, segment_index, start, stop - start)[:count])
                    left -= count
        done = np.zeros(self.total_rows, dtype=bool)
        if taken:
            indices = np.concatenate(taken) % length
            done[indices if rest is None else rest[indices]] = True
        # 4 bytes a row left (8 past 2**31 rows), held by the process and each of its workers.
        if rest is None:
            rest = np.arange(self.total_rows, dtype=np.int32 if self.total_rows < 2**31 else np.int64)
        return rest[~done[rest]]

    def begin_iteration(self) -> None:
        """Called by the loader before it starts workers: applies a loaded state (the layout is
        known now), and a finished epoch moves on to the next unless `set_epoch` asked for it."""
        self._resolve_saved()
        if self.counts.live.samples >= self.rows_per_rank() and not self._epoch_pinned:
            self._start_epoch(self.epoch + 1)
        self._epoch_pinned = False
        self.counts.take_snapshot()

    def count_consumed(self, samples: int) -> None:
        """Called by the loader for every batch it hands out."""
        self.counts.count_batch(samples)

    # ----------------------------------------------------------------------------- reading
    def _check_shard(self, shard: int) -> None:
        if not self.verify_checksums or shard in self._verified:
            return
        entry = self.manifest.shards[shard]
        actual = sha256_file(self.shard_url(shard))
        if actual != entry.sha256:
            raise ChecksumMismatch(
                f"shard {entry.path} of {self.version_url}: sha256 {actual} does not match "
                f"the manifest's {entry.sha256}"
            )
        self._verified.add(shard)

    def _open_shard(self, shard: int) -> Any:
        """An open file of shard `shard`: from the local cache (downloaded and checked there), or its URL."""
        if self.cache is not None:
            entry = self.manifest.shards[shard]
            cached = self.cache.open(self.shard_url(shard), entry.sha256, entry.bytes, entry.path)
            if cached is not None:
                self._verified.add(shard)  # hashed as it was written to the cache
                return cached
        self._check_shard(shard)
        return fsspec.open(self.shard_url(shard), "rb").open()

    def _read_ahead(self, shards: list[int]) -> None:
        """Starts downloading `shards` (this worker's next windows') into the cache."""
        entries = self.manifest.shards
        self.cache.read_ahead((self.shard_url(s), entries[s].sha256, entries[s].bytes, entries[s].path)
                              for s in dict.fromkeys(shards))

    def _read_rows(self, block: Block, lo: int, hi: int) -> pa.Table:
        """Rows [lo, hi) of a block, streamed in record batches so that memory stays at what is
        kept even when row groups are large."""
        if self._open is None or self._open[0] != block.shard:
            self._close()
            handle = self._open_shard(block.shard)
            self._open = (block.shard, pq.ParquetFile(handle), handle)
        kept, offset = [], 0
        batches = self._open[1].iter_batches(READ_BATCH_ROWS, row_groups=[block.row_group], columns=list(LIST_COLUMNS))
        for batch in batches:
            end = offset + batch.num_rows
            if end > lo:
                kept.append(batch.slice(max(lo - offset, 0), min(hi, end) - max(lo, offset)))
            offset = end
            if offset >= hi:
                break
        return pa.Table.from_batches(kept).cast(READ_SCHEMA)

    def _close(self) -> None:
        if self._open is not None:
            self._open[2].close()
            self._open = None

    def _read_window(self, pieces: list[tuple[Block, int, int, np.ndarray | None]]) -> dict[str, Any]:
        """The rows of `pieces` as (flat values, offsets) per list column, plus sample indices."""
        tables, indices = [], []
        for block, lo, hi, rows in pieces:
            # Transient errors: the block is read again on a fresh handle (maskstream.storage.retry).
            read = functools.partial(self._read_rows, block, lo, hi)
            table = retry_read(read, self.shard_url(block.shard), on_retry=self._close)
            tables.append(table if rows is None else table.take(rows))
            offsets = np.arange(hi - lo, dtype=np.int64) if rows is None else rows
            indices.append(block.first_row + lo + offsets)
        table = pa.concat_tables(tables).combine_chunks()
        columns: dict[str, Any] = {"sample_index": np.concatenate(indices)}
        for name in LIST_COLUMNS:
            array = table.column(name).chunk(0)
            offsets = array.offsets.to_numpy()
            columns[name] = (array.flatten().to_numpy(zero_copy_only=False), offsets - offsets[0])
        if self.peer_signals is not None:  # joined for the whole window at once (array work, not per row)
            (word_ids, offsets), (word_index, _) = columns["word_ids"], columns["word_index"]
            for name, values in self.peer_signals.columns(word_ids, word_index, offsets, self.peer_columns).items():
                columns[name] = (values, offsets)
        return columns

    def __iter__(self) -> Iterator[dict[str, Any]]:
        world = World.detect(self.rank, self.world_size)
        worker, num_workers = world.worker, world.workers
        # The training process reads the live position; a worker, the snapshot its iteration started from.
        epoch, consumed, consumed_batches, segments = self.counts.snapshot if world.in_worker_process else self.counts.live
        # A persistent worker keeps the rest an elastic resume left while the main process has moved
        # on: the shared epoch and count of resumes say which rest this iteration reads.
        rest = self._rest_of(epoch, segments)
        length = self.total_rows if rest is None else len(rest)
        if consumed >= rows_per_rank(length, self.world_size):
            return
        layout = Layout(self.world_size, num_workers, self.batch_size or 1)
        plan = RankPlan.of(layout, self.rank, length, self.shuffle_buffer)
        # Resume: batches each worker already delivered, and the worker whose batch is next; the
        # DataLoader asks worker 0 first, so worker ids are rotated to make that worker first.
        delivered, next_worker = round_robin_counts(plan.batches, consumed_batches)
        logical = (worker + next_worker) % num_workers
        skip = delivered[logical] * layout.batch_size
        mine = plan.worker_windows(logical)
        try:
            for i, (start, stop) in enumerate(mine):
                if skip >= stop - start:
                    skip -= stop - start
                    continue
                yield from self._window_samples(epoch, segments, rest, start, stop, skip, mine[i + 1 : i + 3])
                skip = 0
        finally:
            self._close()

    def _window_samples(self, epoch: int, segment: int, rest: np.ndarray | None, start: int, stop: int,
                        skip: int, later: list[tuple[int, int]]) -> Iterator[dict[str, Any]]:
        pieces = self._pieces(epoch, self._positions(rest, start, stop))
        columns = self._read_window(pieces)
        if self.cache is not None:  # the shards of this worker's next windows, downloaded while it trains on this one
            current = {block.shard for block, *_ in pieces}
            self._read_ahead([block.shard for s, e in later
                              for block, *_ in self._pieces(epoch, self._positions(rest, s, e))
                              if block.shard not in current])
        order = self._window_order(epoch, segment, start, stop - start)
        sample_index = columns.pop("sample_index")
        for row in order[skip:]:
            sample = {"sample_index": int(sample_index[row])}
            for name, (values, offsets) in columns.items():
                sample[name] = values[offsets[row] : offsets[row + 1]]
            yield sample

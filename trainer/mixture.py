"""Weighted mixtures of sources: the domain's dataset version with general text replayed beside it.

`maskstream train --dataset DOMAIN --mix SOURCE:WEIGHT[:STRATEGY] ...` trains on the domain and every
SOURCE, each SOURCE taking WEIGHT of the samples and the domain the rest. A SOURCE is a maskstream dataset
version (a root or version folder, local or gs://) or plain text: `.jsonl` / `.parquet` files (a
file, a folder or a glob) with a `text` field, tokenized on the fly with the run's tokenizer.

Contract:

- *The draw*: mixture sample `g` (counted over the whole run and every rank; step `t` of rank `r`
  with batch `B` on `W` ranks takes `g` in `[(t W + r) B, (t W + r + 1) B)`) comes from the source
  `source_schedule(seed, weights)` gives it: a function of the seed and `g` alone. In every block of
  20 consecutive samples each source other than the domain gets `floor(w n)` minus what the blocks
  before got (`n` the samples through the block), the domain the rest, in an order drawn from
  (seed, the block's chunk of 64 blocks). The proportions therefore hold within a few samples over
  any 1,000 consecutive samples (tests/trainer/test_mixture.py: within ±2 %).
- *Each source keeps its own order and masking*: a maskstream source is a
  `StreamingSequenceDataset` read by its own DataLoader (the module doc of
  `maskstream.trainer.dataset`: ranks, workers, epochs); a text source's epoch is its records with
  a text, in file order, record `p` to rank `p % W`, tokenized in the loader workers. The domain is
  masked with the run's `--strategy`, every other source with its STRATEGY, `random` by default
  (general text has no domain signal); a text source masked with `difference` gets the domain
  version's mask map applied as it is read. A source that reaches the end of an epoch starts its next one. Batches
  carry a `source` column (the source's position: 0 is the domain) and an `epoch` column (the
  source's epoch of the row, which keys its masks); `mask_by_source` masks each source's rows.
- *State*: the mixture's sample count and, per source, its loader state before the batch it is
  taking rows from plus the rows already taken from that batch, and its position (the epoch its rows
  come from and the rows this rank took of it). Resuming with the same world size, batch size and
  workers continues the batches exactly. On another layout (elastic resume, from every rank's state):
  the draw goes on from the sample count, and each source continues from the earliest epoch any saved
  rank was in, what the saved ranks took of it (and of the later epochs some had started: each rank
  takes its own number of rows, so ranks cross a source's epoch at different steps) recorded as
  segments of `maskstream.trainer.dataset`'s elastic resume: every row of every source is taken
  once per epoch across the resume, but for the remainder policy of maskstream sources. The sources' DataLoaders
  draw from generators of their own (`loader_generator`), so starting them leaves the model's random
  state alone and a resumed run's dropout continues exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from maskstream.mask_signal.mask_map import MaskMap
from maskstream.storage.lease import VersionLease
from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.follow import LatestVersionFollower, dataset_root, poll_all_ranks
from maskstream.trainer.held_out import held_out
from maskstream.trainer.loader import build_dataloader, loader_generator
from maskstream.trainer.masking import MaskingConfig, apply_masking
from maskstream.trainer.position import Layout, Pending, Segment, position_of
from maskstream.trainer.strategies import PEER_SIGNAL_STRATEGIES, STRATEGIES, peer_columns
from maskstream.trainer.text_source import TEXT_SUFFIXES, TextSource
from maskstream.trainer.world import rows_per_rank

log = logging.getLogger("maskstream.mixture")

BLOCK = 20  # samples per block of the draw: within a block, any source is off its share by at most 5
CHUNK_BLOCKS = 64  # blocks drawn at a time


@dataclasses.dataclass(frozen=True)
class MixSource:
    """One `--mix SOURCE:WEIGHT[:STRATEGY]` (the strategy defaults to random masking)."""

    url: str
    weight: float
    strategy: str = "random"

    @classmethod
    def parse(cls, text: str) -> MixSource:
        head, sep, last = text.rpartition(":")
        strategy = "random"
        if last in STRATEGIES:
            strategy, (head, sep, last) = last, head.rpartition(":")
        try:
            value = float(last)
        except ValueError:
            value = -1.0
        if not sep or not head or not 0 < value < 1:
            raise ValueError(f"--mix {text!r}: expected SOURCE:WEIGHT[:STRATEGY] with 0 < WEIGHT < 1 and STRATEGY "
                             f"one of {', '.join(STRATEGIES)}, e.g. general.jsonl:0.2")
        return cls(head, value, strategy)

    @property
    def is_text(self) -> bool:
        return self.url.rstrip("/").endswith(TEXT_SUFFIXES) or any(c in self.url for c in "*?[")


def mixture_weights(mix: Sequence[MixSource]) -> list[float]:
    """[domain weight, source weights...]: the domain takes what the sources leave, at least 1/20 per
    source (a block of the draw rounds each source up by at most one sample, taken from the domain's)."""
    rest = 1.0 - sum(source.weight for source in mix)
    if rest < len(mix) / BLOCK - 1e-9:
        raise ValueError(f"--mix weights sum to {1 - rest:g}: they must leave the domain at least "
                         f"{len(mix) / BLOCK:g} (1/{BLOCK} per source)")
    return [rest, *(source.weight for source in mix)]


def source_schedule(seed: int, weights: Sequence[float], start: int, count: int) -> np.ndarray:
    """The source (0 = the domain) of mixture samples [start, start + count) (module doc)."""
    first, last = start // BLOCK, (start + count - 1) // BLOCK
    chunks = range(first // CHUNK_BLOCKS, last // CHUNK_BLOCKS + 1)
    labels = np.concatenate([_chunk_labels(seed, tuple(weights), chunk) for chunk in chunks])
    offset = start - chunks[0] * CHUNK_BLOCKS * BLOCK
    return labels[offset : offset + count]


@functools.lru_cache(maxsize=8)
def _chunk_labels(seed: int, weights: tuple[float, ...], chunk: int) -> np.ndarray:
    """The labels of blocks [chunk * CHUNK_BLOCKS, (chunk + 1) * CHUNK_BLOCKS): each block's counts,
    in an order drawn from (seed, chunk), one generator for the chunk's blocks (one per block cost
    more than the rest of a batch's assembly); cached, as consecutive batches (and every rank's)
    read the same blocks."""
    blocks = np.arange(chunk * CHUNK_BLOCKS, (chunk + 1) * CHUNK_BLOCKS)
    others = np.asarray(weights[1:], dtype=np.float64)
    counts = np.floor(others[None, :] * (blocks[:, None] + 1) * BLOCK) - np.floor(others[None, :] * blocks[:, None] * BLOCK)
    ends = np.cumsum(counts.astype(np.int64), axis=1)  # a block's first ends[0] places are source 1's, ...
    before = (np.arange(BLOCK)[None, :, None] >= ends[:, None, :]).sum(axis=2)
    labels = np.where(before < len(others), before + 1, 0)
    return np.random.default_rng([seed, chunk, 0x313C]).permuted(labels, axis=1).ravel()


def source_seed(seed: int, source: int) -> int:
    """The masking seed of a source's rows: the run's for the domain (the same masks as without a
    mixture), another per source, so that rows of two sources with one sample index differ."""
    return seed if source == 0 else seed + 0x9E3779B9 * source


def mask_by_source(batch: dict[str, torch.Tensor], strategies: Sequence[str], masking: MaskingConfig, *,
                   seed: int) -> dict[str, torch.Tensor]:
    """`apply_masking` on each (source, epoch) group of a mixture batch's rows with its source's
    strategy and seed (`source_seed`); the rows keep their places."""
    masked = {**batch, "labels": torch.full_like(batch["input_ids"], -100)}
    masked["input_ids"] = batch["input_ids"].clone()
    groups = torch.stack([batch["source"], batch["epoch"]], dim=1).unique(dim=0).tolist()
    for source, epoch in groups:
        rows = ((batch["source"] == source) & (batch["epoch"] == epoch)).nonzero().flatten()
        part = {k: v[rows] for k, v in batch.items() if k not in ("source", "epoch")}
        done = apply_masking(part, strategies[source], masking, seed=source_seed(seed, source), epoch=epoch)
        masked["input_ids"][rows] = done["input_ids"]
        masked["labels"][rows] = done["labels"]
    return masked


class DatasetSource:
    """A maskstream version read by its own DataLoader (`collate=False`): (epoch, samples) batches.

    With a `follower` (`--follow-latest`), a newer version the mixture's poll found (`pending`: its
    URL and the epoch this rank was in) replaces the one read once this rank has finished that
    epoch of the source: `reopen(url)` gives the new version's dataset and loader. On rank 0,
    `leases` (version URL -> `VersionLease`: gc spares them) hold every version a rank reads or is
    about to read (`Mixture` keeps them in step)."""

    def __init__(self, dataset: Any, loader: Any, label: str | None = None, *, root: str | None = None,
                 reopen: Any = None, follower: Any = None, lease: Any = None) -> None:
        self.dataset, self.loader, self.label = dataset, loader, label
        self.root = root if root is not None else dataset_root(dataset.version_url, dataset.version_url)
        self.reopen, self.follower = reopen, follower
        self.leases = {dataset.version_url: lease} if lease is not None else None
        self.pending: Pending | None = None  # a newer version to move on to
        self.versions = [(0, self._version_name())]  # (first epoch, version): what --sample-log names

    @property
    def name(self) -> str:
        """The label it was given (a --mix source's URL), else the version read (the domain's)."""
        return self.label or self.dataset.manifest.version

    def state_dict(self) -> dict[str, Any]:
        return {**self.dataset.state_dict(), "pending": None if self.pending is None else self.pending.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["version"] != self.dataset.manifest.version:  # a run that followed newer versions
            self._open(f"{self.root}/{state['version']}")
            self.versions = [(0, self._version_name())]
        self.dataset.load_state_dict(state)
        self.pending = Pending.of(state.get("pending"))

    def in_use(self) -> list[str]:
        """The versions this rank reads or will move on to."""
        return [self.dataset.version_url] + ([self.pending.url] if self.pending else [])

    def hold(self, version_urls: set[str]) -> None:
        """Rank 0: leases exactly `version_urls` (what any rank reads or will move on to)."""
        if self.leases is None:
            return
        for url in version_urls - set(self.leases):
            self.leases[url] = VersionLease(url)
        for url in set(self.leases) - version_urls:
            self.leases.pop(url).release()

    def release(self) -> None:
        for lease in (self.leases or {}).values():
            lease.release()
        self.leases = {} if self.leases is not None else None

    def _open(self, version_url: str) -> None:
        if self.reopen is None:
            raise ValueError(f"{self.name}: cannot open {version_url}, another version than {self.dataset.version_url}")
        self.dataset, self.loader = self.reopen(version_url)
        if self.follower is not None:
            self.follower.version_url, self.follower.manifest = self.dataset.version_url, self.dataset.manifest
        if self.leases is not None:  # the old version stays leased until no rank reads it (Mixture)
            self.hold(set(self.leases) | {self.dataset.version_url})

    def _version_name(self) -> str:
        """The domain's version as a run without --mix names it; another source's version URL."""
        return self.dataset.manifest.version if self.label is None else self.dataset.version_url

    def version_of(self, epoch: int) -> str:
        return [version for first, version in self.versions if first <= epoch][-1]

    def _switch_due(self) -> bool:
        position = self.dataset.position()
        finished = position.samples_consumed >= self.dataset.rows_per_rank()
        return self.pending is not None and finished and position.epoch >= self.pending.after_epoch

    def batches(self) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        while True:
            if self._switch_due():  # this rank finished the epoch it was in when the newer version was found
                url, self.pending, next_epoch = self.pending.url, None, self.dataset.epoch + 1
                self._open(url)
                self.dataset.set_epoch(next_epoch)
                self.versions.append((next_epoch, self._version_name()))
                log.info("%s: rank %d reads %s from epoch %d", self.name, self.dataset.rank, url, next_epoch)
            for samples in self.loader:
                yield self.dataset.epoch, samples

    @property
    def layout(self) -> Layout:
        return Layout(self.dataset.world_size, self.loader.num_workers, self.dataset.batch_size)


class Mixture:
    """Batches of `batch_size` rows drawn from `sources` (0 = the domain) by `source_schedule`."""

    def __init__(self, sources: Sequence[Any], weights: Sequence[float], strategies: Sequence[str], *, seed: int,
                 batch_size: int, rank: int, world_size: int, pad_token_id: int, poll_every: int = 0,
                 pin_memory: bool = False, held_out_fraction: float = 0.0) -> None:
        self.sources, self.weights, self.strategies = list(sources), list(weights), list(strategies)
        self.seed, self.batch_size, self.rank, self.world_size = seed, batch_size, rank, world_size
        self.pad_token_id, self.pin_memory = pad_token_id, pin_memory
        self.held_out_fraction = held_out_fraction  # the domain's held-out rows, dropped before collation
        # --follow-latest: every `poll_every` steps (the same steps on every rank) each followed source's
        # root is asked for a newer version; 0: never.
        self.poll_every = poll_every
        self._hold_first = True  # the leases are brought in step at the first batch (after a resume too)
        self.samples = 0  # mixture samples taken by all ranks before this rank's next batch's step
        self._streams = [source.batches() for source in self.sources]
        self._buffers: list[tuple[int, list[dict[str, Any]]] | None] = [None] * len(self.sources)  # epoch, samples
        self._before: list[dict[str, Any] | None] = [None] * len(self.sources)  # state before each buffer
        self._used = [0] * len(self.sources)
        self._skip = [0] * len(self.sources)  # rows of the next batch already taken (exact resume)

    def _take(self, source: int, count: int) -> list[tuple[int, list[dict[str, Any]]]]:
        """The next `count` samples of `source`, as (epoch, samples) pieces of its batches."""
        parts = []
        while count > 0:
            buffer = self._buffers[source]
            if buffer is None or self._used[source] >= len(buffer[1]):
                self._before[source] = self.sources[source].state_dict()
                buffer = self._buffers[source] = next(self._streams[source])
                self._used[source], self._skip[source] = self._skip[source], 0
            start = self._used[source]
            stop = min(start + count, len(buffer[1]))
            parts.append((buffer[0], buffer[1][start:stop]))
            self._used[source] = stop
            count -= stop - start
        return parts

    def _poll(self) -> None:
        """Asks each followed source's root for a newer version (decided by rank 0 for every rank); a
        newer compatible one is read once each rank has finished the epoch of the source it is in."""
        for source in self.sources:
            if getattr(source, "follower", None) is not None:
                switch = poll_all_ranks(source.follower, self.world_size)
                if switch is not None:
                    source.pending = Pending(switch.version_url, source.dataset.epoch)

    def _hold_versions(self) -> None:
        """Rank 0 leases every version any rank reads or will move on to, and no other (ranks move on
        at their own epoch boundaries: an old version stays leased until the last has left it)."""
        followed = [source for source in self.sources if getattr(source, "follower", None) is not None]
        in_use = [source.in_use() for source in followed]
        if self.world_size > 1:
            # heavy: torch and transformers load only when a model is needed (--help stays fast)
            import torch.distributed as dist

            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, in_use)
            in_use = [[url for rank in gathered for url in rank[i]] for i in range(len(followed))]
        for source, urls in zip(followed, in_use, strict=True):
            source.hold(set(urls))

    def next_batch(self) -> dict[str, torch.Tensor] | None:
        """This rank's next batch: the sources' samples in the draw's order (row j is mixture sample
        `first + j`), the domain's held-out rows left out, collated once, with `source` and `epoch` columns
        (unmasked: `mask_by_source`); None when every row was held out. Always `batch_size` rows dealt."""
        poll = self.poll_every and (self.samples // (self.world_size * self.batch_size)) % self.poll_every == 0
        if poll:
            self._poll()
        if poll or (self.poll_every and self._hold_first):
            self._hold_versions()
            self._hold_first = False
        first = self.samples + self.rank * self.batch_size
        labels = source_schedule(self.seed, self.weights, first, self.batch_size)
        rows: list[Any] = [None] * self.batch_size
        epochs = np.empty(self.batch_size, dtype=np.int64)
        for source in range(len(self.sources)):
            places = np.flatnonzero(labels == source).tolist()
            for epoch, samples in self._take(source, len(places)) if places else []:
                for place, sample in zip(places, samples, strict=False):
                    rows[place] = sample
                    epochs[place] = epoch
                places = places[len(samples):]
        self.samples += self.world_size * self.batch_size
        if self.held_out_fraction:  # held-out rows are the domain's: other sources are trained on whole
            indices = np.array([row["sample_index"] for row in rows])
            kept = ~(held_out(indices, self.held_out_fraction) & (labels == 0))
            if not kept.any():
                return None
            rows, epochs, labels = [row for row, keep in zip(rows, kept, strict=True) if keep], epochs[kept], labels[kept]
        # Dropped before collation, so that the pinned batch is the one moved to the device (a selection
        # after pinning would copy it back into pageable memory, and the transfer would wait).
        batch = collate_sequences(rows, self.pad_token_id)
        batch["epoch"], batch["source"] = torch.from_numpy(epochs), torch.from_numpy(labels)
        if self.pin_memory:  # page-locked, so that the transfer to the GPU can overlap (as a DataLoader's)
            batch = {name: column.pin_memory() for name, column in batch.items()}
        return batch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor] | None]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        states = []
        for source in range(len(self.sources)):
            mid_batch = self._before[source] is not None and self._used[source] < len(self._buffers[source][1])
            if mid_batch:  # the state before the batch, but a version switch decided since
                before = dict(self._before[source])
                if isinstance(self.sources[source], DatasetSource):
                    pending = self.sources[source].pending
                    before["pending"] = None if pending is None else pending.to_dict()
                states.append({"state": before, "used": self._used[source]})
            else:  # between batches; or resumed and not read since: the rows to skip are still pending
                states.append({"state": self.sources[source].state_dict(),
                               "used": self._skip[source] if self._before[source] is None else 0})
        return {"samples": self.samples, "layout": self.layout, "weights": self.weights, "sources": states,
                "positions": [self._position(source) for source in range(len(self.sources))]}

    def domain_position(self) -> tuple[int, int, int]:
        """The domain's epoch, the rows of it this rank has still to take, and the rows a whole epoch
        gives each rank: where a plan in domain epochs starts (maskstream.trainer.plan)."""
        taken, dataset = self._position(0), self.sources[0].dataset
        return taken["epoch"], dataset.rows_per_rank() - taken["rows"], rows_per_rank(dataset.total_rows, self.world_size)

    def domain_rows(self, start: int, count: int) -> np.ndarray:
        """Which of the mixture samples `start` .. `start + count - 1` the draw gives the domain."""
        return source_schedule(self.seed, self.weights, start, count) == 0

    def _position(self, source: int) -> dict[str, int]:
        """The epoch a source's rows are being taken from, the rows taken of it on this rank (of what
        was left of it, after an elastic resume) and the source's live state (its segments, version
        and pending switch now, not before the batch in use): what an elastic resume works from."""
        state = self.sources[source].state_dict()
        buffer = self._buffers[source]
        unused = 0 if buffer is None else len(buffer[1]) - self._used[source]
        pending = self._skip[source] if self._before[source] is None else 0
        return {"epoch": int(state["epoch"]), "rows": position_of(state).taken - unused + pending, "live": state}

    @property
    def layout(self) -> list[int]:
        """What a mixture's state resumes only with: world size, batch size, each source's loader workers."""
        workers = [source.loader.num_workers if isinstance(source, DatasetSource) else 0 for source in self.sources]
        return [self.world_size, self.batch_size, *workers]

    def load_state_dict(self, states: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Resumes from this rank's `state_dict()` (the same layout: exactly), or from every rank's, in
        rank order (exactly on the same layout, elastically on another: module doc)."""
        states = [states] if isinstance(states, dict) else list(states)
        state = states[0]
        if [round(w, 9) for w in state["weights"]] != [round(w, 9) for w in self.weights]:
            raise ValueError(f"cannot resume: the mixture's weights were {state['weights']}, now {self.weights}")
        if len(state["sources"]) != len(self.sources):
            raise ValueError(f"cannot resume: the mixture had {len(state['sources'])} sources, now {len(self.sources)}")
        self.samples = int(state["samples"])
        if list(state["layout"]) == self.layout:
            state = state if len(states) == 1 else states[self.rank]
            for source, saved in zip(self.sources, state["sources"], strict=True):
                source.load_state_dict(saved["state"])
            # The rows already taken from each source's last batch are skipped when it is read again.
            self._skip = [int(saved["used"]) for saved in state["sources"]]
        else:
            if any("live" not in p for s in states for p in s.get("positions", [{}])):
                raise ValueError("cannot resume a mixture on another layout from a checkpoint written before "
                                 "elastic mixtures: resume on its layout")
            if len(states) != state["layout"][0]:
                raise ValueError(f"cannot resume a mixture on another layout (saved (world size, batch size, workers "
                                 f"per source) {state['layout']}, now {self.layout}) from {len(states)} of its "
                                 f"{state['layout'][0]} ranks' states: an elastic resume needs every rank's")
            for index, source in enumerate(self.sources):
                source.load_state_dict(elastic_state([s["positions"][index] for s in states], source.layout))
            self._skip = [0] * len(self.sources)
        self._streams = [source.batches() for source in self.sources]
        self._hold_first = True
        self._buffers = [None] * len(self.sources)
        self._before = [None] * len(self.sources)
        self._used = [0] * len(self.sources)

    @property
    def names(self) -> list[str]:
        return [source.name for source in self.sources]

    def name_of(self, source: int, epoch: int) -> str:
        """What --sample-log calls a row of `source`'s `epoch`: the version it was read from, for a
        maskstream source (it may follow newer versions), else the source's name."""
        version_of = getattr(self.sources[source], "version_of", None)
        return version_of(epoch) if version_of is not None else self.sources[source].name

    def close(self) -> None:
        """Releases the sources' leases."""
        for source in self.sources:
            if isinstance(source, DatasetSource):
                source.release()

    def counts(self, batch: dict[str, torch.Tensor]) -> list[int]:
        """Rows of each source in `batch`."""
        return torch.bincount(batch["source"], minlength=len(self.sources)).tolist()


def elastic_state(positions: Sequence[dict[str, Any]], layout: Layout) -> dict[str, Any]:
    """A source's state on `layout` continuing every saved rank's (rank `r` having taken
    `positions[r]["rows"]` of epoch `positions[r]["epoch"]`, with its live state
    `positions[r]["live"]`): the earliest epoch any rank is in,
    with what the saved ranks took of it (and of the later epochs some had started) recorded as
    segments, so that every row is taken once (maskstream.trainer.dataset's elastic resume)."""
    saved = [position_of(p["live"]) for p in positions]
    pending = [Pending.of(p["live"].get("pending")) for p in positions]
    versions = {(getattr(s, "version", None), p.url if p else None) for s, p in zip(saved, pending, strict=True)}
    if len(versions) > 1:
        raise ValueError(f"cannot resume on another layout while the saved ranks read different versions of a "
                         f"source ({', '.join(sorted(str(v) for v, _ in versions))}: a --follow-latest switch was "
                         "under way); resume on the checkpoint's layout, or from another checkpoint")
    epochs = [int(p["epoch"]) for p in positions]
    first, last = min(epochs), max(epochs)
    old = Layout(len(saved), saved[0].layout.num_workers, saved[0].layout.batch_size)

    def earlier_segments(epoch: int) -> list[Segment]:
        """The resumes epoch `epoch` had seen: its own for ranks in it, announced to ranks before it."""
        found = {tuple(s.segments) for s, e in zip(saved, epochs, strict=True) if e == epoch}
        found |= {tuple(s.ahead[epoch]) for s, e in zip(saved, epochs, strict=True) if e < epoch and epoch in s.ahead}
        if len(found) > 1:
            raise ValueError(f"cannot resume: the saved ranks disagree on the earlier resumes of epoch {epoch}")
        return list(found.pop()) if found else []

    def taken(epoch: int) -> Segment:
        rows = [p["rows"] if e == epoch else (-1 if e > epoch else 0) for p, e in zip(positions, epochs, strict=True)]
        return Segment(old, rows=tuple(int(r) for r in rows))

    later = {e: s for position in saved for e, s in position.ahead.items() if e > last}
    later.update({epoch: earlier_segments(epoch) + [taken(epoch)] for epoch in range(first + 1, last + 1)})
    state = saved[0].resumed(layout, first, earlier_segments(first) + [taken(first)], dict(sorted(later.items())))
    state = state.to_dict()
    if pending[0] is not None:  # found while the ranks were in different epochs: after the last of them
        state["pending"] = Pending(pending[0].url, max(p.after_epoch for p in pending)).to_dict()
    return state


def build_mixture(domain: StreamingSequenceDataset, mix: Sequence[str], tokenizer: Any, *, strategy: str,
                  seed: int, batch_size: int, num_workers: int = 0, cache: Any = None, follow: bool = False,
                  domain_follower: Any = None, lease: Any = None, pin_memory: bool = False,
                  held_out_fraction: float = 0.0) -> Mixture:
    """The mixture of `domain` and every `SOURCE:WEIGHT` of `mix`, on the domain's ranks, each read by
    a loader of its own with `num_workers` workers: maskstream sources checked against the domain's
    vocabulary, text sources tokenized by `tokenizer` at the domain's max length. The domain is masked
    with `strategy`, every other source with its own (`SOURCE:WEIGHT:STRATEGY`, random by default).

    `follow` (--follow-latest) follows the domain's root (with `domain_follower`) and each maskstream
    source's, polled once per domain epoch's worth of steps. `lease` is the domain's (rank 0); rank 0
    leases every other maskstream source's version too. A text source masked with `difference`
    (`TEXT:WEIGHT:difference`) takes the domain's signal (`MaskMap.from_version` of the domain's
    version), applied as the text is read."""
    entries = [MixSource.parse(entry) for entry in mix]
    rank, world_size = domain.rank, domain.world_size

    def loader_of(dataset: StreamingSequenceDataset) -> Any:
        return build_dataloader(dataset, batch_size=batch_size, num_workers=num_workers, strategy=None,
                                masking=None, generator=loader_generator(), collate=False)

    def reopen(url: str, columns: tuple[str, ...]) -> tuple[StreamingSequenceDataset, Any]:
        dataset = StreamingSequenceDataset(url, seed=seed, rank=rank, world_size=world_size, cache=cache,
                                           shuffle_buffer=domain.shuffle_buffer, peer_columns=columns)
        return dataset, loader_of(dataset)

    domain_root = domain_follower.root if domain_follower is not None else None
    sources: list[Any] = [DatasetSource(domain, loader_of(domain), root=domain_root,
                                        reopen=functools.partial(reopen, columns=domain.peer_columns),
                                        follower=domain_follower if follow else None, lease=lease)]
    max_length = int(domain.manifest.config.get("max_length", 128))  # the build's --max-length
    for entry in entries:
        if entry.is_text:
            if entry.strategy in PEER_SIGNAL_STRATEGIES:
                raise ValueError(f"--mix {entry.url}:{entry.weight}:{entry.strategy}: a text source has no peer signals; "
                                 "mix a dataset version built with `maskstream build --peer-signals` instead")
            mask_map = None
            if entry.strategy == "difference":  # the domain's signal, as a build of this text would store it
                try:
                    mask_map = MaskMap.from_version(domain.version_url)
                except (OSError, KeyError, ValueError) as e:
                    raise ValueError(f"--mix {entry.url}:{entry.weight}:difference: the mask map of "
                                     f"{domain.version_url} cannot be read ({e})") from None
            sources.append(TextSource(entry.url, tokenizer, max_length, batch_size=batch_size, rank=rank,
                                      world_size=world_size, num_workers=num_workers, mask_map=mask_map))
            continue
        source_reopen = functools.partial(reopen, columns=peer_columns(entry.strategy))
        dataset, loader = source_reopen(entry.url)
        if dataset.manifest.tokenizer.get("vocab_hash") != domain.manifest.tokenizer.get("vocab_hash"):
            raise ValueError(f"--mix {entry.url}: {dataset.version_url} was tokenized with another vocabulary than "
                             f"{domain.version_url}")
        root = dataset_root(entry.url, dataset.version_url)
        follower = (LatestVersionFollower(root, dataset.version_url, dataset.manifest,
                                          needs_peer_signals=bool(dataset.peer_columns)) if follow else None)
        source_lease = VersionLease(dataset.version_url) if lease is not None else None
        sources.append(DatasetSource(dataset, loader, entry.url, root=root, reopen=source_reopen, follower=follower,
                                     lease=source_lease))
    weights = mixture_weights(entries)
    log.info("mixture: %s", ", ".join(f"{source.name} {weight:.0%}" for source, weight
                                      in zip(sources, weights, strict=True)))
    # A poll per domain epoch's worth of steps: about when a run without --mix would look (at its epoch ends).
    poll_every = math.ceil(domain.rows_per_rank() / max(1.0, weights[0] * batch_size)) if follow else 0
    return Mixture(sources, weights, [strategy] + [entry.strategy for entry in entries], seed=seed,
                   batch_size=batch_size,
                   rank=rank, world_size=world_size, pad_token_id=int(domain.manifest.tokenizer["pad_token_id"]),
                   poll_every=poll_every, pin_memory=pin_memory, held_out_fraction=held_out_fraction)

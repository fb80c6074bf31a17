"""Plain text as a training source: JSONL or Parquet `text` fields tokenized on the fly, split across
ranks and DataLoader workers, resumable on another layout (a mixture's other kind of source beside a
maskstream version, maskstream.trainer.mixture)."""

from __future__ import annotations

import collections
import itertools
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset

from maskstream.mask_signal.mask_map import MaskMap
from maskstream.trainer.loader import loader_generator, samples_as_read
from maskstream.trainer.position import Ahead, Layout, Segment, TextPosition, announced
from maskstream.trainer.text_samples import TextEncoder, text_samples
from maskstream.trainer.world import World

TEXT_SUFFIXES = (".jsonl", ".json", ".parquet")
LOG = logging.getLogger("maskstream.train")


def _untaken(records: Iterator[tuple[int, str]], segment: Segment) -> Iterator[tuple[int, str]]:
    """The records an earlier layout left: it dealt record `p` of `records` to rank `p % W`, and
    rank `r` took its first `segment.rows[r]` (-1: all of them)."""
    world_size, rows = segment.layout.world_size, segment.rows
    for position, record in enumerate(records):
        taken = rows[position % world_size]
        if 0 <= taken <= position // world_size:
            yield record


class TextSource:
    """Plain text (JSONL or Parquet `text` fields) tokenized on the fly: samples like a maskstream
    version's (with a mask map, its word ids and mask probabilities; else maskstream's word rule and
    probability 0: maskstream.trainer.text_samples). An epoch's order is the records with a text, files sorted; record `p` of what
    is left of it goes to rank `p % world_size` (no remainder padding: a mixture's ranks take their
    own counts anyway). `sample_index` is the record's number."""

    def __init__(self, url: str, tokenizer: Any, max_length: int, *, batch_size: int, rank: int, world_size: int,
                 num_workers: int = 0, mask_map: MaskMap | None = None, text_field: str = "text") -> None:
        self.url, self.tokenizer, self.max_length = url, tokenizer, max_length
        # The domain's MaskMap: word ids and mask probabilities as a build of the text with
        # the domain's signal would store them (for difference masking); None: maskstream's words, 0.
        self.mask_map = mask_map
        self.encoder = TextEncoder(tokenizer, max_length)
        if mask_map is not None:
            mask_map.check_tokenizer(tokenizer)
        self.batch_size, self.rank, self.world_size, self.text_field = batch_size, rank, world_size, text_field
        self.num_workers = num_workers  # DataLoader workers that tokenize (0: in this process)
        self.files = self._files(url)
        if not self.files:
            raise ValueError(f"--mix {url}: no .jsonl or .parquet file there")
        self.epoch, self.records = 0, 0  # records of this rank consumed in the epoch
        # Elastic resumes of the epoch (earlier layouts and the records each rank took) and of later
        # epochs, as in maskstream.trainer.dataset.
        self.segments: list[Segment] = []
        self.ahead: Ahead = {}
        self.name = url

    @staticmethod
    def _files(url: str) -> list[str]:
        """The text files `url` names (a file, a folder or a glob; fsspec expands globs), sorted."""
        fs, _, paths = fsspec.get_fs_token_paths(url)
        found = [p for path in paths for p in (fs.find(path) if fs.isdir(path) else [path])]
        return sorted(fs.unstrip_protocol(p) for p in found if p.endswith(TEXT_SUFFIXES))

    def _all_texts(self) -> Iterator[str]:
        """The epoch's order: every record's text, in file order. A record without one (a line that is
        not a JSON object, a missing or non-text field, a null) is skipped, as a build rejects it, and
        counted: once a file is read, rank 0's first reader logs how many it rejected and why."""
        for path in self.files:
            read, rejected = 0, collections.Counter()
            for text in self._file_texts(path, rejected):
                read += 1
                if isinstance(text, str):
                    yield text
            if rejected:
                self._report_rejects(path, read, rejected)

    def _file_texts(self, path: str, rejected: collections.Counter) -> Iterator[str | None]:
        """Each record's text, or None for a rejected one (its reason counted in `rejected`): as a build,
        a line that is not UTF-8 or JSON, a record with no text, or an empty text is rejected and the
        file read on."""
        if path.endswith(".parquet"):
            with fsspec.open(path, "rb") as f:
                for batch in pq.ParquetFile(f).iter_batches(columns=[self.text_field]):
                    for text in batch.column(0).to_pylist():
                        yield self._checked(text, rejected)
            return
        with fsspec.open(path, "rb") as f:
            for number, raw in enumerate(f):
                try:
                    # utf-8-sig on the first line: a byte-order mark is no part of the record
                    line = raw.decode("utf-8-sig" if number == 0 else "utf-8")
                except UnicodeDecodeError:
                    rejected["not UTF-8"] += 1
                    yield None
                    continue
                if not line.strip():
                    continue  # a blank line is no record
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    rejected["not JSON"] += 1
                    yield None
                    continue
                if not isinstance(record, dict):
                    rejected["not a JSON object"] += 1
                    yield None
                    continue
                yield self._checked(record.get(self.text_field), rejected)

    def _checked(self, text: Any, rejected: collections.Counter) -> str | None:
        if not isinstance(text, str):
            rejected[f"no text in {self.text_field!r}"] += 1
            return None
        if not text.strip():
            rejected["empty document"] += 1
            return None
        return text

    def _report_rejects(self, path: str, read: int, rejected: collections.Counter) -> None:
        world = World.detect(self.rank, self.world_size)
        if world.rank == 0 and world.worker == 0:  # every reader reads every record: one line, not one each
            reasons = ", ".join(f"{count} {reason}" for reason, count in rejected.most_common())
            LOG.warning("--mix %s: %d of %d records rejected (%s); trained on the other %d", path,
                        sum(rejected.values()), read, reasons, read - sum(rejected.values()))

    def _texts(self, segments: Sequence[Segment]) -> Iterator[tuple[int, str]]:
        """This rank's (record number, text) of the epoch, in order: what `segments` left, dealt."""
        left: Iterator[tuple[int, str]] = enumerate(self._all_texts())
        for segment in segments:
            left = _untaken(left, segment)
        return (record for position, record in enumerate(left) if position % self.world_size == self.rank)

    def position(self) -> TextPosition:
        return TextPosition(self.epoch, self.records, self.world_size, self.url, list(self.segments), dict(self.ahead))

    def state_dict(self) -> dict[str, Any]:
        """`position()` as a checkpoint holds it (JSON)."""
        return self.position().to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = TextPosition.of(state)
        if saved.world_size != self.world_size:
            raise ValueError(f"--mix {self.url}: a text source resumes on another world size only elastically "
                             "(Mixture.load_state_dict with every rank's state)")
        self.epoch, self.records = saved.epoch, saved.records
        self.segments, self.ahead = saved.segments, saved.ahead

    @property
    def layout(self) -> Layout:
        return self.position().layout

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """(epoch, samples) of `batch_size` records, forever: the next epoch starts where one ends.
        The records taken are counted here, as batches are handed out (the workers read ahead)."""
        while True:
            epoch = TextEpoch(self, self.epoch, self.records, list(self.segments))
            loader = DataLoader(epoch, batch_size=None, num_workers=self.num_workers, collate_fn=samples_as_read,
                                prefetch_factor=2 if self.num_workers else None, generator=loader_generator())
            for samples in loader:
                self.records += len(samples)
                yield self.epoch, samples
            if self.records == 0 and not self.segments:  # a whole epoch without a record for this rank
                raise ValueError(f"--mix {self.url}: rank {self.rank} has no text to read")
            self.epoch, self.records = self.epoch + 1, 0
            self.segments, self.ahead = announced(self.ahead, self.epoch)

    def samples(self, records: list[tuple[int, str]]) -> list[dict[str, Any]]:
        """The records tokenized, as samples of a maskstream version (maskstream.trainer.text_samples): with
        the mask map's word ids and mask probabilities, or maskstream's word rule and probability 0."""
        texts = [text for _, text in records]
        return text_samples(texts, *self.encoder.encode(texts), [index for index, _ in records],
                            mask_map=self.mask_map, width=self.max_length)


class TextEpoch(IterableDataset):
    """A text source's batches of one epoch on one rank, from its record `skip` on: batch `k` is
    tokenized by DataLoader worker `k % num_workers`, so that the DataLoader's round robin hands them
    out in order, whatever the number of workers."""

    def __init__(self, source: TextSource, epoch: int, skip: int, segments: list[Segment]) -> None:
        super().__init__()
        self.source, self.epoch, self.skip, self.segments = source, epoch, skip, segments

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        world = World.detect(self.source.rank, self.source.world_size)
        worker, workers = world.worker, world.workers
        texts = itertools.islice(self.source._texts(self.segments), self.skip, None)
        for k, chunk in enumerate(iter(lambda: list(itertools.islice(texts, self.source.batch_size)), [])):
            if k % workers == worker:
                yield self.source.samples(chunk)

"""The build's tokenizing step as Beam transforms: documents -> windows (`TokenizeToWindows`).

The work itself is `maskstream.pipelines.dataset.core.sequences`' (Beam-free, shared with `maskstream update`);
this module only batches, groups and counts it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa

from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.pipelines.dataset.core.sequences import (
    flat,
    split_by_pack_group,
    tokenize_documents,
    window_template,
    windows,
)
from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer


class TokenizeDocuments(beam.DoFn):
    """Batches of documents -> tokenized tables (TOKENIZED_SCHEMA), or, with `max_length`, their
    windows (WINDOWS_SCHEMA, truncate mode); documents without a token go to "rejects"."""

    def __init__(self, tokenizer_name: str, max_length: int = 0):
        self._tokenizer_name = tokenizer_name
        self._max_length = max_length
        self._documents = beam.metrics.Metrics.counter("build", "documents_tokenized")
        self._empty = beam.metrics.Metrics.counter("build", "documents_without_tokens")
        self._tokens = beam.metrics.Metrics.counter("build", "tokens")
        self._across = beam.metrics.Metrics.counter("build", "tokens_across_words")
        self._ms = beam.metrics.Metrics.counter("build", "tokenize_ms")

    def setup(self) -> None:
        self._tokenizer = load_backend_tokenizer(self._tokenizer_name)
        self._template = window_template(self._tokenizer_name)

    def process(self, batch: Sequence[Any], vocabulary: WordLookup) -> Iterator[Any]:
        started = time.perf_counter()
        table, empty, across = tokenize_documents(self._tokenizer, batch, vocabulary)
        self._across.inc(across)
        for document in empty:
            self._empty.inc()
            yield beam.pvalue.TaggedOutput(
                "rejects", {"source": document.source, "location": document.document_id, "reason": "no tokens"})
        self._documents.inc(table.num_rows)
        self._tokens.inc(len(flat(table, "input_ids")[0]))
        if table.num_rows:
            yield windows(table, "", self._template, self._max_length, "truncate") if self._max_length else table
        self._ms.inc(int((time.perf_counter() - started) * 1000))


class _PackGroups(beam.DoFn):
    """(group, tokenized tables) -> the group's windows, documents in document-id order."""

    def __init__(self, tokenizer_name: str, max_length: int):
        self._tokenizer_name = tokenizer_name
        self._max_length = max_length
        self._ms = beam.metrics.Metrics.counter("build", "windows_ms")

    def setup(self) -> None:
        self._template = window_template(self._tokenizer_name)

    def process(self, element: tuple[str, Sequence[pa.Table]]) -> Iterator[pa.Table]:
        started = time.perf_counter()
        unit, tables = element
        yield windows(pa.concat_tables(tables), unit, self._template, self._max_length, "pack")
        self._ms.inc(int((time.perf_counter() - started) * 1000))


class TokenizeToWindows(beam.PTransform):
    """Documents -> {"windows": WINDOWS_SCHEMA tables, "rejects": dict} (documents without a token).

    Each element of "windows" holds the windows of a batch of documents (truncate) or of one
    packing group (pack); every unit's windows are in exactly one element.
    """

    def __init__(
        self,
        tokenizer_name: str,
        vocabulary,
        *,
        max_length: int = 128,
        packing: str = "truncate",
        pack_group_size: int = 2000,
        batch_size: int = 1024,
    ):
        super().__init__()
        if packing not in ("truncate", "pack"):
            raise ValueError(f"packing must be 'truncate' or 'pack', got {packing!r}")
        self._tokenizer_name = tokenizer_name
        self._vocabulary = vocabulary
        self._max_length = max_length
        self._packing = packing
        self._pack_group_size = pack_group_size
        self._batch_size = batch_size

    def expand(self, documents):
        truncate = self._packing == "truncate"
        tokenized = (
            documents
            | "BatchDocuments" >> beam.BatchElements(min_batch_size=self._batch_size, max_batch_size=self._batch_size)
            | "Tokenize"
            >> beam.ParDo(
                TokenizeDocuments(self._tokenizer_name, self._max_length if truncate else 0), self._vocabulary
            ).with_outputs("rejects", main="tables")
        )
        if truncate:
            return {"windows": tokenized.tables, "rejects": tokenized.rejects}
        count = documents | "CountDocuments" >> beam.combiners.Count.Globally()
        windows = (
            tokenized.tables
            | "SplitByPackGroup" >> beam.FlatMap(split_by_pack_group, beam.pvalue.AsSingleton(count),
                                                 self._pack_group_size)
            | "GroupForPacking" >> beam.GroupByKey()
            | "PackGroups" >> beam.ParDo(_PackGroups(self._tokenizer_name, self._max_length))
        )
        return {"windows": windows, "rejects": tokenized.rejects}

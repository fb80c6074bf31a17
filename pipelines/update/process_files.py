"""The update's per-file work as a Beam pipeline: for changes too large for one process.

`maskstream update` counts and tokenizes the changed files in its own process when they are
small (changed_files.IN_PROCESS_MAX_BYTES); larger changes go through `ProcessFiles`, so that a
multi-worker runner (Dataflow, `--direct_num_workers`) spreads them. Both write the same cache
entries (`cache.count_and_tokenize_file`).
"""

from __future__ import annotations

import time

import apache_beam as beam

from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer
from maskstream.pipelines.read_corpus import ReadCorpus
from maskstream.pipelines.update.cache import count_and_tokenize_file


class ProcessFileFn(beam.DoFn):
    """(path, {"key", "documents", "rejects"}) -> writes the file's cache entry; yields its key."""

    def __init__(self, cache_url: str, tokenizer: str, batch_size: int):
        self._cache_url, self._tokenizer_name, self._batch_size = cache_url, tokenizer, batch_size
        self._files = beam.metrics.Metrics.counter("update", "files_processed")
        self._documents = beam.metrics.Metrics.counter("update", "documents_tokenized")
        self._across = beam.metrics.Metrics.counter("update", "tokens_across_words")
        self._ms = beam.metrics.Metrics.counter("update", "process_files_ms")

    def setup(self) -> None:
        self._tokenizer = load_backend_tokenizer(self._tokenizer_name)

    def process(self, element: tuple[str, dict[str, list]]):
        started = time.perf_counter()
        path, grouped = element
        (key,) = grouped["key"]
        done = count_and_tokenize_file(path, key, list(grouped["documents"]), list(grouped["rejects"]),
                                       self._cache_url, self._tokenizer, self._batch_size)
        self._files.inc()
        self._documents.inc(done["documents"])
        self._across.inc(done["tokens_across_words"])
        self._ms.inc(int((time.perf_counter() - started) * 1000))
        yield key


class ProcessFiles(beam.PTransform):
    """{path: cache key} -> one cache entry per file (PCollection of the keys written)."""

    def __init__(self, keys: dict[str, str], cache_url: str, tokenizer: str, text_field: str, txt_mode: str,
                 batch_size: int):
        super().__init__()
        self._keys, self._cache_url, self._tokenizer = dict(keys), cache_url, tokenizer
        self._text_field, self._txt_mode, self._batch_size = text_field, txt_mode, batch_size

    def expand(self, pbegin):
        corpus = pbegin | "ReadCorpus" >> ReadCorpus(sorted(self._keys), self._text_field, self._txt_mode)
        return (
            {
                # Every file gets a group, also one that yields neither documents nor rejects.
                "key": pbegin | "Files" >> beam.Create(sorted(self._keys.items())),
                "documents": corpus["documents"] | "DocumentsBySource" >> beam.Map(lambda d: (d.source, d)),
                "rejects": corpus["rejects"] | "RejectsBySource" >> beam.Map(lambda r: (r["source"], r)),
            }
            | "GroupByFile" >> beam.CoGroupByKey()
            | "CountAndTokenize" >> beam.ParDo(ProcessFileFn(self._cache_url, self._tokenizer, self._batch_size))
        )

"""The update's memory. `update` and `watch` hold the merged word statistics of the whole corpus in
one process, so a vocabulary too large for it is refused before the cache is read (`check_memory`);
and a long-running `watch` hands back what each rebuild freed (`release_unused_memory`)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from maskstream.pipelines.dataset.storage.dataset_writer import join
from maskstream.pipelines.update.cache import FILES_DIR, IO_THREADS
from maskstream.pipelines.update.malloc import trim_malloc

LOG = logging.getLogger("maskstream.update")

# What the in-process update holds per word type, at most (docs/scale.md: 1.6 kB measured), rounded up.
UPDATE_BYTES_PER_WORD_TYPE = 2_000
UPDATE_BASE_BYTES = 1 << 30  # the process, the tokenizer and the encoder


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(cache_url: str, keys: dict[str, str]) -> None:
    """Raises MemoryError when the files' word types (`keys`: path -> cache key; the bound is the sum of
    each file's own types) need more than the memory available (UPDATE_BYTES_PER_WORD_TYPE a type):
    such corpora are `maskstream build`'s, on Dataflow."""

    def word_types(path: str) -> int:
        with fsspec.open(join(cache_url, FILES_DIR, keys[path], "words.parquet"), "rb") as f:
            return pq.ParquetFile(f).metadata.num_rows

    with ThreadPoolExecutor(IO_THREADS) as pool:
        bound = sum(pool.map(word_types, sorted(keys)))
    needed, available = UPDATE_BASE_BYTES + bound * UPDATE_BYTES_PER_WORD_TYPE, available_memory()
    if available is not None and needed > available:
        raise MemoryError(
            f"`maskstream update` holds about {UPDATE_BYTES_PER_WORD_TYPE:,} bytes a word type in one process: up to "
            f"{bound:,} word types need {needed / 2**30:.1f} GiB, {available / 2**30:.1f} GiB are available. Build "
            "this corpus with `maskstream stats`, `seeds` and `build` on Dataflow (--runner=DataflowRunner), whose "
            "workers hold 18 bytes a word type (docs/scale.md)")
    LOG.info("memory check: up to %d word types, about %.1f GiB needed, %s available", bound, needed / 2**30,
             "unknown" if available is None else f"{available / 2**30:.1f} GiB")


def release_unused_memory() -> None:
    """Hands back to the system the memory a rebuild freed but the allocators keep: pyarrow's pool
    keeps freed pages for reuse, and glibc's malloc keeps freed blocks in its arenas (one per thread
    that allocated: the update's I/O threads, the tokenizer's). A long-running `watch` otherwise grows
    by megabytes a rebuild though its live objects do not (docs/updates.md, "Memory")."""
    pa.default_memory_pool().release_unused()
    trim_malloc()

"""Incremental rebuilds: per-file results and word embeddings cached beside the dataset root.

    ROOT/_cache/files/KEY/{words.parquet, documents.parquet, entry.json}
        what depends on one input file only: its word counts (word, tf, df) and its tokenized
        documents (token ids, word occurrence ids, and per token the word as an index into the
        file's own sorted word list, since the dataset's word_index changes between versions).
        KEY = sha256 of (the file's path, its content sha256, and FileSettings: the tokenizer's
        full definition, the word normalization, text field, txt mode, cache format).
        entry.json is written last: an entry without it is incomplete and is recomputed.
    ROOT/_cache/general_frequency/LANGUAGE-wordfreq-VERSION/part-*.parquet
        (word, frequency) of every word looked up in the wordfreq tables so far.
    ROOT/_cache/embeddings/ENCODER_KEY/part-*.parquet
        (word, embedding) of every word and seed encoded so far, by the encoder (name and
        weights hash), pooling, tokens per word and dtype (float32 or bfloat16) of ENCODER_KEY;
        each update appends one part.

`update()` fingerprints the corpus, processes only the files without a cache entry (in its own
process when they are small, IN_PROCESS_MAX_BYTES, else a Beam pipeline: ReadCorpus, then count
and tokenize each file, process_files.py), merges the per-file counts, and
recomputes everything global from them: TF-ICF (the wordfreq tables, whose lookups are cached too),
the seeds, the word
table (encoding only the words and seeds missing from the embedding cache, of the words that
pass `--min-word-count` in the merged counts: pipelines/dataset/vocabulary.py), the nearest-seed
similarities, the windows and the mask probabilities. Those steps reuse the functions of
`maskstream stats`, `seeds` and `build`, so an update with a warm cache writes the same rows
as one with an empty cache (a full rebuild), and as `maskstream build` in `truncate` mode.
Packing (`--packing pack`) packs documents within each input file, in document order.

What every update pays whatever changed is kept small: the word encoder loads only when a file
the update counted brings a word the embedding cache lacks (in a process of its own, started as
soon as that file is counted, while this one tokenizes and computes the statistics and the
windows; once per process, so `maskstream watch` keeps it), torch is imported only there, the tokenizer's facts come from a cache keyed by its content
(tokenizer_facts.py), cached entries are read and shards written on threads, windows,
probabilities and counts are computed on whole Arrow columns, and Python's cyclic garbage
collector is paused for the update.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import gc
import hashlib
import io
import json
import logging
import logging.handlers
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.dataset.dataset_writer import join, write_atomically
from pipelines.dataset.sequences import TOKENIZED_SCHEMA, natural_key
from pipelines.dataset.word_encoder import DEFAULT_EMBED_BATCH_SIZE
from schemas.models import MAX_WORD_TOKENS

LOG = logging.getLogger("maskstream.update")

CACHE_DIR = "_cache"
FILES_DIR = "files"
EMBEDDINGS_DIR = "embeddings"
FREQUENCIES_DIR = "general_frequency"  # wordfreq lookups, by language and wordfreq version
ENTRY_NAME = "entry.json"
CACHE_FORMAT = 2  # bump when what a cache entry holds changes (2: word ids by overlap, schemas.alignment)
IO_THREADS = 4  # cache reads and shard writes at once


def sha256_text(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class FileSettings:
    """Everything besides the file's path and content that a per-file cache entry depends on."""

    tokenizer: str  # name or path
    tokenizer_definition_sha256: str  # the fast tokenizer's whole JSON (vocab, normalizer, ...)
    text_field: str = "text"
    txt_mode: str = "line"

    def key(self) -> str:
        from schemas.words import WORD_NORMALIZATION

        return sha256_text(json.dumps({**dataclasses.asdict(self), "tokenizer": None,
                                       "word_normalization": WORD_NORMALIZATION, "format": CACHE_FORMAT},
                                      sort_keys=True))

    def entry_key(self, path: str, content_sha256: str) -> str:
        return entry_key(self.key(), path, content_sha256)


def entry_key(settings_key: str, path: str, content_sha256: str) -> str:
    """The cache key of one input file (`maskstream gc` recomputes it from a manifest)."""
    return sha256_text(settings_key, path, content_sha256)


def file_settings(tokenizer: str, text_field: str, txt_mode: str) -> FileSettings:
    from pipelines.dataset.sequences import load_backend_tokenizer

    definition = load_backend_tokenizer(tokenizer).to_str()
    return FileSettings(tokenizer, sha256_text(definition), text_field, txt_mode)


def encoder_key(encoder: str, pooling: str, dtype: str = "float32", batch_rows: int = DEFAULT_EMBED_BATCH_SIZE) -> str:
    """Identifies word embeddings: the encoder's name, or for a local folder the hash of its
    weights and config (a retrained model in the same folder gets a new key), the dtype it ran in
    and the rows of its batches (a batch's shape can change an embedding's last bits). Keys of the
    defaults, float32 and DEFAULT_EMBED_BATCH_SIZE, are those of caches made before either was in it."""
    files: tuple = ()
    if os.path.isdir(encoder):
        names = sorted(n for n in os.listdir(encoder) if n.endswith((".safetensors", ".bin", ".json", ".txt")))
        stats = [os.stat(os.path.join(encoder, n)) for n in names]
        files = tuple((n, st.st_size, st.st_mtime_ns) for n, st in zip(names, stats, strict=True))
    return _encoder_key(encoder, pooling, dtype, batch_rows, files)


@functools.lru_cache(maxsize=8)
def _encoder_key(encoder: str, pooling: str, dtype: str, batch_rows: int, files: tuple) -> str:
    # Keyed also on each file's size and modification time: a long-running watch hashes a local
    # model's weights once, not on every rebuild, and still sees them replaced.
    parts = [encoder, pooling, str(MAX_WORD_TOKENS)] + ([f"dtype:{dtype}"] if dtype != "float32" else [])
    parts += [f"batch_rows:{batch_rows}"] if batch_rows != DEFAULT_EMBED_BATCH_SIZE else []
    for name, _, _ in files:
        with open(os.path.join(encoder, name), "rb") as f:
            parts.append(f"{name}:{hashlib.sha256(f.read()).hexdigest()}")
    if os.path.isdir(encoder):
        parts[0] = "local"  # the same weights anywhere are the same encoder
    return sha256_text(*parts)[:32]


# ---------------------------------------------------------------- per-file entries


def count_and_tokenize_file(path: str, key: str, documents: list, rejects: list[dict[str, str]], cache_url: str,
                            tokenizer: Any, batch_size: int,
                            counted: Callable[[list[str]], None] | None = None) -> dict[str, int]:
    """Writes the cache entry of one input file from its parsed documents and rejects; returns
    {"documents", "tokens_across_words"}. Counts words exactly as `maskstream stats`
    (`word_counts_of_texts`) and tokenizes exactly as `maskstream build` (`tokenize_documents`),
    in batches. `counted(words)` is called with the file's word types before it is tokenized."""
    from collections import Counter

    from pipelines.dataset.build_steps import vocabulary_index
    from pipelines.dataset.sequences import tokenize_documents
    from pipelines.statistics.counting import word_counts_of_texts

    documents = sorted(documents, key=lambda d: natural_key(d.document_id))
    rejects = sorted(rejects, key=lambda r: natural_key(r["location"]))
    tf: Counter = Counter()
    df: Counter = Counter()
    for start in range(0, len(documents), batch_size):
        for word, (count, holding) in word_counts_of_texts([d.text for d in documents[start : start + batch_size]]):
            tf[word] += count
            df[word] += holding
    words = sorted(tf)
    if counted is not None:
        counted(words)
    local = vocabulary_index(words)  # the file's own sorted word list
    tables, across = [], 0
    for start in range(0, len(documents), batch_size):
        table, empty, batch_across = tokenize_documents(tokenizer, documents[start : start + batch_size], local)
        across += batch_across
        tables.append(table)
        rejects.extend({"source": d.source, "location": d.document_id, "reason": "no tokens"} for d in empty)
    entry_url = join(cache_url, FILES_DIR, key)
    write_parquet_file(pa.table({
        "word": pa.array(words, pa.string()),
        "tf": pa.array([tf[w] for w in words], pa.int64()),
        "df": pa.array([df[w] for w in words], pa.int64()),
    }), join(entry_url, "words.parquet"))
    tokenized = pa.concat_tables(tables) if tables else TOKENIZED_SCHEMA.empty_table()
    write_parquet_file(tokenized, join(entry_url, "documents.parquet"))
    entry = {"path": path, "documents": len(documents), "rejects": rejects, "format": CACHE_FORMAT}
    write_atomically(join(entry_url, ENTRY_NAME), json.dumps(entry).encode("utf-8"))
    return {"documents": len(documents), "tokens_across_words": across}


def parse_file(path: str, text_field: str, txt_mode: str) -> tuple[list, list[dict[str, str]]]:
    """(documents, rejects) of one input file, read as `ReadCorpus` reads it, in this process."""
    from pipelines.corpus import Document, FileParser

    documents, rejects = [], []
    for record in FileParser(text_field, txt_mode).records(path):
        (documents if isinstance(record, Document) else rejects).append(record)
    return documents, rejects


def write_parquet_file(table: pa.Table, url: str) -> None:
    from pipelines.dataset.dataset_writer import write_parquet

    write_parquet(table, url, 100_000)


@dataclasses.dataclass
class FileEntry:
    path: str
    key: str
    documents: int
    rejects: list[dict[str, str]]
    words: pa.Table  # word, tf, df
    tokenized: pa.Table  # TOKENIZED_SCHEMA, word_index into `words`


def read_entry(cache_url: str, path: str, key: str) -> FileEntry:
    url = join(cache_url, FILES_DIR, key)
    with fsspec.open(join(url, ENTRY_NAME), "rb") as f:
        entry = json.loads(f.read())
    tables = {}
    for name in ("words", "documents"):
        with fsspec.open(join(url, f"{name}.parquet"), "rb") as f:
            tables[name] = pq.read_table(f)
    return FileEntry(path, key, entry["documents"], entry["rejects"], tables["words"], tables["documents"])


def complete_entries(cache_url: str) -> set[str]:
    fs, path = fsspec.core.url_to_fs(join(cache_url, FILES_DIR))
    return {p.rstrip("/").split("/")[-2] for p in fs.glob(f"{path}/*/{ENTRY_NAME}")}


# ---------------------------------------------------------------- word embeddings


# A cache folder's parts are merged into one past this many: a read opens every part (a round trip
# each on gs://), and a long-running watch appends one per rebuild.
PARTS_BEFORE_COMPACTION = 16


def read_parts(folder: str, columns: list[str] | None = None) -> list[pa.Table]:
    """The tables of a cache folder that updates append to (part-*.parquet), in name order. A part
    that another update's compaction removed between the listing and the read is found again in
    its merged part: the folder is listed again."""
    fs, path = fsspec.core.url_to_fs(folder)

    def read(part: str) -> pa.Table:
        with fs.open(part, "rb") as f:
            return pq.read_table(f, columns=columns)

    listings = 3
    while True:
        try:
            return [read(part) for part in sorted(fs.glob(f"{path}/part-*.parquet"))]
        except FileNotFoundError:
            listings -= 1
            if not listings:
                raise


def _part_name() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def append_part(folder: str, table: pa.Table) -> None:
    """Adds `table` to a cache folder as a new part (named by UTC time and a random suffix), then
    compacts the folder if it holds more than PARTS_BEFORE_COMPACTION parts."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    fs, path = fsspec.core.url_to_fs(folder)
    fs.makedirs(path, exist_ok=True)
    # Atomic, so readers (which list part-*) never see half a part.
    write_atomically(join(folder, f"part-{_part_name()}.parquet"), buffer.getvalue())
    compact_parts(folder)


def compact_parts(folder: str) -> None:
    """Merges the parts of a cache folder into one once there are more than
    PARTS_BEFORE_COMPACTION, streaming part by part. The merged part is complete before the parts
    in it are removed, so a reader always finds every row (some twice, in between, or after two
    updates compacted at once: the caches hold one value per word, so a repeated row changes
    nothing)."""
    from pipelines.dataset.dataset_writer import open_atomically

    fs, path = fsspec.core.url_to_fs(folder)
    parts = sorted(fs.glob(f"{path}/part-*.parquet"))
    if len(parts) <= PARTS_BEFORE_COMPACTION:
        return
    try:
        with open_atomically(join(folder, f"part-{_part_name()}.parquet")) as sink:
            writer = None
            for part in parts:
                with fs.open(part, "rb") as f:
                    table = pq.read_table(f)
                writer = writer or pq.ParquetWriter(sink, table.schema, compression="zstd")
                writer.write_table(table)
            writer.close()
    except FileNotFoundError:  # another update compacted these parts meanwhile
        return
    for part in parts:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(part)
    LOG.info("%s: %d parts merged into one", folder, len(parts))


def read_embeddings(cache_url: str, key: str, wanted: set[str]) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    for table in read_parts(join(cache_url, EMBEDDINGS_DIR, key)):
        table = table.filter(pc.is_in(table.column("word"), pa.array(sorted(wanted), pa.string())))
        dim = table.schema.field("embedding").type.list_size
        vectors = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(-1, dim)
        found.update(zip(table.column("word").to_pylist(), vectors, strict=True))
    return found


def cached_words(cache_url: str, key: str) -> pa.Array:
    """Every word the embedding cache of encoder `key` holds."""
    parts = read_parts(join(cache_url, EMBEDDINGS_DIR, key), columns=["word"])
    return pa.chunked_array([chunk for part in parts for chunk in part.column("word").chunks], pa.string()
                            ).combine_chunks()


def general_frequencies(cache_url: str, language: str, words: pa.Array) -> np.ndarray:
    """wordfreq's frequency in `language` of each of `words` (float64, aligned with them): those
    looked up by an earlier update from the cache, the others looked up now and appended to it.
    (wordfreq takes about 70 us a word: seconds of every update for a vocabulary of 100 k.)"""
    from importlib import metadata

    from wordfreq import word_frequency

    folder = join(cache_url, FREQUENCIES_DIR, f"{language}-wordfreq-{metadata.version('wordfreq')}")
    parts = read_parts(folder)
    cached = pa.concat_tables(parts) if parts else pa.table({"word": pa.array([], pa.string()),
                                                             "frequency": pa.array([], pa.float64())})
    position = pc.index_in(words, cached.column("word")).to_numpy(zero_copy_only=False)
    found = ~np.isnan(position)
    frequencies = np.zeros(len(words), np.float64)
    frequencies[found] = cached.column("frequency").to_numpy()[position[found].astype(np.int64)]
    missing = np.flatnonzero(~found)
    if len(missing):
        new = words.take(pa.array(missing)).to_pylist()
        frequencies[missing] = [word_frequency(w, language) for w in new]
        append_part(folder, pa.table({"word": pa.array(new, pa.string()),
                                      "frequency": pa.array(frequencies[missing], pa.float64())}))
    return frequencies


# The word encoder runs in a process of its own: importing torch and transformers and loading the
# model take seconds of CPU that hold the GIL, which on a thread beside the statistics slowed both
# (0.22 s of statistics took 1.36 s beside the load); a second process uses a second core and
# imports no Beam. Words and embeddings cross as arrays.
_LOADED: Any = None  # in the encoder's process: its LoadedEncoder


def _start_encoder_process(records: Any, level: int) -> None:
    """The encoder process's initializer: its log records go to the parent's loggers, and it
    ignores SIGINT and SIGTERM, which a terminal's Ctrl-C or a service manager also sends to it:
    its parent decides (`maskstream watch` finishes the rebuild under way, then stops), and it
    ends with its parent, however that ends (a pool's worker would otherwise wait for work forever
    after a SIGKILL of its parent, holding the model's memory)."""
    import multiprocessing.connection
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        def exit_with_parent() -> None:
            multiprocessing.connection.wait([parent.sentinel])
            os._exit(0)

        threading.Thread(target=exit_with_parent, name="exit-with-parent", daemon=True).start()
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(level)


def _load_in_encoder_process(encoder: Any) -> float:
    """Loads `encoder` (a WordEncoder) in the encoder's process; returns the seconds it took."""
    global _LOADED
    started = time.perf_counter()
    _LOADED = encoder.load()
    # Leave torch's objects out of the collector's passes, the last one at exit included (see cli.run).
    gc.freeze()
    return round(time.perf_counter() - started, 3)


def _encode_in_encoder_process(words: list[str]) -> tuple[list[str], np.ndarray]:
    """(words, float32 embeddings row by row) of `words`, in `word_batches` order."""
    batches = _LOADED.encoder.batches(words)
    return [w for batch in batches for w in batch], np.concatenate([_LOADED.encode(batch) for batch in batches])


class _RelogHandler(logging.Handler):
    """The encoder process's records, handled by this process's logger of the same name."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


@functools.lru_cache(maxsize=1)
def _encoder_process(encoder: Any) -> tuple[ProcessPoolExecutor, Future]:
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # CUDA-safe, and free of this process's threads
    records = context.Queue()
    logging.handlers.QueueListener(records, _RelogHandler()).start()
    pool = ProcessPoolExecutor(1, mp_context=context, initializer=_start_encoder_process,
                               initargs=(records, logging.getLogger().getEffectiveLevel()))
    return pool, pool.submit(_load_in_encoder_process, encoder)


class EncoderLoader:
    """The word encoder of `config`, started loading in a process of its own, once per process:
    `maskstream watch` keeps it between rebuilds. `encode()` waits for the load and re-raises its
    error (and forgets a failed load)."""

    def __init__(self, config: Any):
        self._pool, self._loading = _encoder_process(config.word_encoder())

    def submit(self, words: Sequence[str]) -> Future:
        """Starts encoding `words` (batched as the build batches them, `word_batches`) once loaded;
        `result()` of the returned future gives their embeddings."""
        return self._pool.submit(_encode_in_encoder_process, list(words))

    def result(self, pending: Future) -> dict[str, np.ndarray]:
        """{word: float32 embedding} of a `submit`; the load's error if it failed."""
        try:
            self._loading.result()
            encoded, vectors = pending.result()
        except BaseException:
            _encoder_process.cache_clear()
            self._pool.shutdown(wait=False, cancel_futures=True)
            raise
        return dict(zip(encoded, vectors, strict=True))

    def load_seconds(self) -> float | None:
        """Seconds the load took (in the background), None while it runs or if it failed."""
        if not self._loading.done() or self._loading.exception() is not None:
            return None
        return self._loading.result()


def write_embeddings_part(cache_url: str, key: str, embeddings: dict[str, np.ndarray]) -> None:
    if not embeddings:
        return
    from pipelines.dataset.dataset_writer import embeddings_table

    append_part(join(cache_url, EMBEDDINGS_DIR, key), embeddings_table(embeddings))


# ---------------------------------------------------------------- the update


@dataclasses.dataclass
class UpdateOptions:
    inputs: list[str]
    root: str
    build: Any  # pipelines.dataset.build_steps.BuildConfig
    text_field: str = "text"
    txt_mode: str = "line"
    top_k: int = 20
    min_df: int = 3
    min_length: int = 3
    stop_words: str = "english"
    alphabetic_only: bool = True
    general_language: str = "en"
    unseen_count: float = 0.5
    version: str | None = None
    beam_args: list[str] = dataclasses.field(default_factory=list)


def word_stats(entries: Iterable[FileEntry], language: str, unseen_count: float, cache_url: str
               ) -> tuple[list[dict], int, int]:
    """(WORD_STATS rows sorted by word, documents N, total words), as `maskstream stats` computes them."""
    from pipelines.statistics.tf_icf import word_stats_row, wordfreq_floor

    entries = list(entries)
    documents = sum(entry.documents for entry in entries)
    # Sum (tf, df) per word over the files, in Arrow; then one row per word, sorted by word.
    merged = pa.concat_tables([entry.words for entry in entries]).group_by("word").aggregate(
        [("tf", "sum"), ("df", "sum")]).sort_by("word")
    frequencies = general_frequencies(cache_url, language, merged.column("word").combine_chunks())
    words, tf, df = (merged.column(c).to_pylist() for c in ("word", "tf_sum", "df_sum"))
    total = sum(tf)
    floor = wordfreq_floor(unseen_count)
    rows = [word_stats_row((w, (t, d), f), total, floor)
            for w, t, d, f in zip(words, tf, df, frequencies.tolist(), strict=True)]
    return rows, documents, total


def windows_of(entries: Sequence[FileEntry], index: Any, tokenizer: str, max_length: int,
               packing: str) -> pa.Table:
    """Every window of the corpus (WINDOWS_SCHEMA) in sequence-id order, as the build orders them."""
    from pipelines.dataset.build_steps import sequence_ids, sequence_offsets, unit_counts
    from pipelines.dataset.sequences import (
        WINDOWS_SCHEMA,
        cut_windows,
        flat,
        list_column,
        load_backend_tokenizer,
        pack_documents,
        pack_separator,
        sort_documents,
        special_template,
    )

    prefix, suffix = special_template(load_backend_tokenizer(tokenizer))
    separator = pack_separator(tokenizer)
    tables = []
    for entry in entries:
        if entry.tokenized.num_rows == 0:
            continue
        # The file's own word list -> this version's word table rows (a local -1 hits the trailing -1).
        to_global = np.append(index.index_of(entry.words.column("word").to_pylist()), np.int32(-1))
        local, offsets = flat(entry.tokenized, "word_index")
        documents = entry.tokenized.set_column(
            entry.tokenized.schema.get_field_index("word_index"), "word_index",
            list_column(to_global[local], offsets, pa.int32()))
        if packing == "pack":  # within the file, in document order
            tables.append(pack_documents(entry.path, sort_documents(documents), separator, prefix, suffix,
                                         max_length))
        else:
            tables.append(cut_windows(documents, prefix, suffix, max_length))
    windows = pa.concat_tables(tables) if tables else WINDOWS_SCHEMA.empty_table()
    # The build's own numbering, so that both order the rows alike.
    ids = sequence_ids(windows, sequence_offsets([unit_counts(windows)]))
    return windows.take(np.argsort(ids, kind="stable"))


def update(options: UpdateOptions) -> dict[str, Any]:
    """Writes a new dataset version of `options.inputs` under `options.root`, reusing the cache.

    Returns a report: the version URL, what was processed and encoded, and seconds per step.
    Raises ValueError/FileNotFoundError/FileExistsError on bad input, before writing a version.
    """
    # Python's cyclic collector would walk the millions of objects torch, transformers and Beam
    # keep alive each time the update's own (acyclic) rows and lists pass its thresholds: about
    # a second of a rebuild. It runs again once the update is done.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _update(options)
    finally:
        if enabled:
            gc.enable()


class StageClock:
    """Seconds per stage: `lap(name)` closes the stage that began at the previous lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._clock = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._clock, 3)
        self._clock = now


def _update(options: UpdateOptions) -> dict[str, Any]:
    """The build's steps (pipelines/dataset/build_steps.py) in one process, stage by stage."""
    clock = StageClock()
    run = start_update(options)
    clock.lap("fingerprint")
    count_and_tokenize(run)
    clock.lap("count_and_tokenize")
    check_memory(run)
    entries = read_cache(run)
    for entry in entries:  # files a Beam pipeline counted
        if entry.key in run.processed:
            start_encoder_if_new_words(run, entry.words.column("word"))
    clock.lap("read_cache")
    statistics = stats_and_seeds(entries, options, run.config, run.cache_url)
    clock.lap("stats_and_seeds")
    embeddings_of = embed_words(run, statistics)
    # The windows need no embedding: cut while the encoder's process loads and encodes.
    windows = windows_of(entries, statistics.index, run.config.tokenizer, run.config.max_length, run.config.packing)
    clock.lap("windows")
    embeddings = embeddings_of()
    clock.lap("embed_words")
    scores = word_similarity(statistics, embeddings, run.config.reduce)
    clock.lap("similarity")
    shards, tallies = write_shards(run, windows, scores.similarity)
    clock.lap("mask_probability_and_shards")
    manifest = write_version(run, entries, statistics, scores, shards, tallies)
    clock.lap("write")
    return {"version": run.version_url, "rows": windows.num_rows, "shards": len(shards),
            "word_types": len(statistics.vocabulary), "seeds": statistics.seeds, "vocabulary": manifest.vocabulary,
            "counts": run.counters, "seconds": clock.seconds,
            "encoder_load_seconds": run.encoder.load_seconds() if run.encoder else None}


@dataclasses.dataclass
class UpdateRun:
    """What the update's stages share: where it writes, which files it reads, and its counters."""

    options: UpdateOptions
    config: Any  # pipelines.dataset.build_steps.BuildConfig
    root: str
    cache_url: str
    version: str
    version_url: str
    fingerprint: dict[str, Any]
    settings: FileSettings
    keys: dict[str, str]  # input path -> cache key
    embedding_key: str  # the embedding cache's folder (encoder_key)
    counters: dict[str, int]
    processed: set[str] = dataclasses.field(default_factory=set)  # keys counted and tokenized by this update
    encoder: EncoderLoader | None = None  # started only when there are words to encode
    cached_words: pa.Array | None = None  # the embedding cache's words, read once needed


def start_update(options: UpdateOptions) -> UpdateRun:
    """The corpus's files and their cache keys; a fresh version folder."""
    from pipelines.corpus import corpus_fingerprint
    from pipelines.dataset.dataset_writer import new_version_name, prepare_version

    config = options.build
    root = options.root.rstrip("/")
    found = corpus_fingerprint(options.inputs)
    settings = file_settings(config.tokenizer, options.text_field, options.txt_mode)
    keys = {f["path"]: settings.entry_key(f["path"], f["sha256"]) for f in found["files"]}
    version = options.version or new_version_name()
    version_url = prepare_version(root, version)
    counters = {"files": len(keys), "files_processed": 0, "documents_tokenized": 0, "bytes_changed": 0}
    return UpdateRun(options, config, root, join(root, CACHE_DIR), version, version_url, found, settings, keys,
                     encoder_key(config.encoder, config.pooling, config.encoder_dtype, config.embed_batch_size), counters)


# Changed input up to this size is counted and tokenized in the update's own process; above it, by
# a Beam pipeline (which a multi-worker runner spreads). Measured (benchmarks/small_update.py, 2
# cores): one process 0.31 s + 0.368 s/MB, a 2-worker DirectRunner pipeline 3.03 s + 0.304 s/MB,
# even at 43 MB; at 32 MB the pipeline took 1.07x one process's time. More workers catch up sooner.
IN_PROCESS_MAX_BYTES = 32 << 20


def count_and_tokenize(run: UpdateRun) -> None:
    """A cache entry for every input file that has none: in this process when the files are small
    (IN_PROCESS_MAX_BYTES in all), else a Beam pipeline over those files only."""
    complete = complete_entries(run.cache_url)
    missing = {path: key for path, key in run.keys.items() if key not in complete}
    sizes = {f["path"]: f["bytes"] for f in run.fingerprint["files"]}
    changed = sum(sizes[path] for path in missing)
    in_process = changed <= IN_PROCESS_MAX_BYTES
    LOG.info("%s: %d input files, %d cached, %d to count and tokenize (%.1f MB, %s)", run.version_url,
             len(run.keys), len(run.keys) - len(missing), len(missing), changed / 1e6,
             "in this process" if in_process else "a Beam pipeline")
    run.counters["bytes_changed"] = changed
    run.processed = set(missing.values())
    if not missing:
        return
    if in_process:
        from pipelines.dataset.sequences import load_backend_tokenizer

        tokenizer = load_backend_tokenizer(run.config.tokenizer)
        for path, key in sorted(missing.items()):
            documents, rejects = parse_file(path, run.options.text_field, run.options.txt_mode)
            done = count_and_tokenize_file(path, key, documents, rejects, run.cache_url, tokenizer,
                                           run.config.tokenize_batch_size,
                                           counted=functools.partial(start_encoder_if_new_words, run))
            run.counters["files_processed"] += 1
            run.counters["documents_tokenized"] += done["documents"]
        return
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.dataset.build_steps import pipeline_counters
    from pipelines.lifecycle.process_files import ProcessFiles

    options = run.options
    pipeline = beam.Pipeline(options=PipelineOptions(list(options.beam_args)))
    _ = pipeline | "ProcessFiles" >> ProcessFiles(missing, run.cache_url, run.config.tokenizer, options.text_field,
                                                  options.txt_mode, run.config.tokenize_batch_size)
    result = pipeline.run()
    result.wait_until_finish()
    for name, value in pipeline_counters(result, "update").items():
        run.counters[name] = run.counters.get(name, 0) + value


def start_encoder_if_new_words(run: UpdateRun, words: list[str] | pa.ChunkedArray) -> None:
    """Starts loading the word encoder in the background (while this process counts, tokenizes and
    computes the statistics) if `words`, counted in a file this update processed, hold one the
    embedding cache lacks: the only way new words appear."""
    if run.encoder is not None:
        return
    if run.cached_words is None:
        run.cached_words = cached_words(run.cache_url, run.embedding_key)
    candidates = pc.unique(pa.array(words, pa.string()) if isinstance(words, list) else words)
    if not pc.all(pc.is_in(candidates, run.cached_words)).as_py():
        run.encoder = EncoderLoader(run.config)


# What the in-process update holds per word type, at most: measured 1.6 kB (peak RSS over a 2 k-type
# run, 200 k synthetic word types in 4,000 documents, corpus included; docs/scale.md), rounded up.
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


def check_memory(run: UpdateRun) -> None:
    """Refuses, before reading the cache, a vocabulary too large for this one process: `update` and
    `watch` hold the merged word statistics in memory (UPDATE_BYTES_PER_WORD_TYPE a type); larger
    corpora are `maskstream build`'s, on Dataflow. The bound is the sum of the files' own word types."""
    import pyarrow.parquet as pq

    def word_types(path: str) -> int:
        with fsspec.open(join(run.cache_url, FILES_DIR, run.keys[path], "words.parquet"), "rb") as f:
            return pq.ParquetFile(f).metadata.num_rows

    with ThreadPoolExecutor(IO_THREADS) as pool:
        bound = sum(pool.map(word_types, sorted(run.keys)))
    needed, available = UPDATE_BASE_BYTES + bound * UPDATE_BYTES_PER_WORD_TYPE, available_memory()
    if available is not None and needed > available:
        raise MemoryError(
            f"`maskstream update` holds about {UPDATE_BYTES_PER_WORD_TYPE:,} bytes a word type in one process: up to "
            f"{bound:,} word types need {needed / 2**30:.1f} GiB, {available / 2**30:.1f} GiB are available. Build "
            "this corpus with `maskstream stats`, `seeds` and `build` on Dataflow (--runner=DataflowRunner), whose "
            "workers hold 18 bytes a word type (docs/scale.md)")
    LOG.info("memory check: up to %d word types, about %.1f GiB needed, %s available", bound, needed / 2**30,
             "unknown" if available is None else f"{available / 2**30:.1f} GiB")


def read_cache(run: UpdateRun) -> list[FileEntry]:
    """Every input file's cache entry, in path order."""
    # Threads: reading and decoding Parquet releases the GIL (local disk or gs://).
    with ThreadPoolExecutor(IO_THREADS) as pool:
        return list(pool.map(lambda path: read_entry(run.cache_url, path, run.keys[path]), sorted(run.keys)))


@dataclasses.dataclass
class Statistics:
    """The merged word statistics and what they decide: the seeds and the words the encoder sees."""

    rows: list[dict]  # WORD_STATS rows sorted by word
    documents: int
    total_words: int
    seed_rows: list[dict]
    seeds_config: dict[str, Any]
    seeds: list[str]
    vocabulary: list[str]  # the word types, sorted: position = word_index
    index: Any  # pipelines.dataset.word_lookup.WordLookup: word -> word_index
    encoded: list[str]


def stats_and_seeds(entries: Sequence[FileEntry], options: UpdateOptions, config: Any, cache_url: str) -> Statistics:
    """`maskstream stats` and `seeds` on the merged per-file counts; the words to encode."""
    from pipelines.dataset.build_steps import vocabulary_index
    from pipelines.dataset.vocabulary import encoded_words
    from pipelines.statistics.seed_selection import load_stop_words, select_seeds

    rows, documents, total_words = word_stats(entries, options.general_language, options.unseen_count, cache_url)
    if not rows:
        raise ValueError(f"no word in {' '.join(options.inputs)}")
    seed_rows = select_seeds(rows, options.top_k, min_df=options.min_df, min_length=options.min_length,
                             stop_words=load_stop_words(options.stop_words), alphabetic_only=options.alphabetic_only)
    if not seed_rows:
        raise ValueError(f"no word of {len(rows)} passes the seed filters")
    seeds_config = {"top_k": options.top_k, "min_df": options.min_df, "min_length": options.min_length,
                    "stop_words": options.stop_words, "alphabetic_only": options.alphabetic_only}
    seeds, vocabulary = [row["word"] for row in seed_rows], [row["word"] for row in rows]
    word_counts = {row["word"]: row["tf"] for row in rows}
    return Statistics(rows, documents, total_words, seed_rows, seeds_config, seeds, vocabulary,
                      vocabulary_index(vocabulary), encoded_words(word_counts, config.min_word_count, seeds))


def embed_words(run: UpdateRun, statistics: Statistics) -> Callable[[], dict[str, np.ndarray]]:
    """Starts encoding the encoded words and seeds the embedding cache lacks (in the encoder's
    process); returns a function that waits for them, appends them to the cache and returns the
    embeddings of all of them."""
    key = run.embedding_key
    wanted = set(statistics.encoded) | set(statistics.seeds)
    embeddings = read_embeddings(run.cache_url, key, wanted)
    missing = sorted(wanted - embeddings.keys())
    if missing and run.encoder is None:
        run.encoder = EncoderLoader(run.config)
    pending = run.encoder.submit(missing) if missing else None

    def result() -> dict[str, np.ndarray]:
        new = run.encoder.result(pending) if pending is not None else {}
        write_embeddings_part(run.cache_url, key, new)
        embeddings.update(new)
        run.counters["words_encoded"] = len(new)
        run.counters["words_from_cache"] = len(wanted) - len(new)
        return embeddings

    return result


def word_similarity(statistics: Statistics, embeddings: dict[str, np.ndarray], reduce: str) -> Any:
    """Every word type's WordScores: each encoded word scored against the seeds, the others the fallback."""
    from pipelines.dataset.build_steps import score_words, word_scores

    encoded = statistics.encoded
    scored = score_words(encoded, np.stack([embeddings[w] for w in encoded]),
                         [(seed, embeddings[seed]) for seed in statistics.seeds], reduce, statistics.index)
    return word_scores([scored], len(statistics.index), statistics.seeds)


def write_shards(run: UpdateRun, windows: pa.Table, similarity: np.ndarray) -> tuple[list, dict | None]:
    """Rows, mask probabilities and the shard files of `windows` (in sequence-id order); returns
    the shard entries and the merged signal tallies."""
    from pipelines.dataset.build_steps import sequence_rows, shard_bounds, shard_count, signal_tally
    from pipelines.dataset.dataset_writer import write_shard
    from pipelines.dataset.signal import merge_map_tallies

    config, total = run.config, windows.num_rows
    shards = shard_count({"total": total}, config.num_shards, config.shard_rows)
    bounds = shard_bounds(total, shards)

    def compute_and_write(shard: int) -> tuple[Any, dict]:
        start, end = bounds[shard], bounds[shard + 1]
        rows = sequence_rows(windows.slice(start, end - start), np.arange(start, end), similarity, config)
        tally = signal_tally(rows, similarity, config, total)
        return write_shard(run.version_url, shard, shards, [rows], config.row_group_rows), tally

    # Shards in parallel: numpy, Parquet encoding and hashing release the GIL.
    with ThreadPoolExecutor(IO_THREADS) as pool:
        entries, tallies = zip(*pool.map(compute_and_write, range(shards)), strict=True)
    return list(entries), merge_map_tallies(tallies)


def write_version(run: UpdateRun, entries: Sequence[FileEntry], statistics: Statistics, scores: Any,
          shards: list, tallies: dict | None) -> Any:
    """The word table, rejects, seeds.json and, last, the manifest and `latest`; returns the manifest."""
    from pipelines.dataset.build_steps import (
        assemble_manifest,
        manifest_fields,
        vocabulary_counts,
        vocabulary_tally,
        word_table_rows,
        word_table_shards,
        write_rejects,
        write_word_table_shard,
    )
    from pipelines.dataset.dataset_writer import write_manifest_and_latest
    from schemas.formulas import FORMULA_VERSIONS
    from schemas.manifest import SEEDS_NAME

    options, config = run.options, run.config
    words = pa.array(statistics.vocabulary, pa.string())
    shards_of_words = word_table_shards(len(statistics.index))
    for shard, rows in word_table_rows(words, statistics.index, scores):  # the whole vocabulary: each shard once
        write_word_table_shard(run.version_url, shard, shards_of_words, [rows])
    tf = np.array([row["tf"] for row in statistics.rows], np.int64)
    vocabulary = vocabulary_counts(vocabulary_tally(words, tf, config.min_word_count, statistics.seeds),
                                   config.min_word_count)
    rejects = [r for entry in entries for r in entry.rejects]
    rejected = write_rejects(run.version_url, rejects)
    no_tokens = sum(1 for r in rejects if r["reason"] == "no tokens")
    seeds_json = {"seeds": statistics.seed_rows, "config": statistics.seeds_config,
                  "formulas": dict(FORMULA_VERSIONS), "source_fingerprint": run.fingerprint}
    write_atomically(join(run.version_url, SEEDS_NAME), (json.dumps(seeds_json, indent=2) + "\n").encode("utf-8"))
    fields = manifest_fields(
        run.version, config, statistics.seeds, run.fingerprint,
        {"input": list(options.inputs), "seeds_config": statistics.seeds_config,
         "general_language": options.general_language, "unseen_count": options.unseen_count,
         "text_field": options.text_field, "txt_mode": options.txt_mode, "documents": statistics.documents,
         "total_words": statistics.total_words, "file_cache_settings": run.settings.key(),
         "embedding_cache": run.embedding_key,
         "beam_args": list(options.beam_args)})
    accepted = statistics.documents - no_tokens
    manifest = assemble_manifest(fields, shards, read=accepted + rejected, accepted=accepted, rejected=rejected,
                                 extra_files=[], tallies=tallies, vocabulary=vocabulary, lookup=statistics.index,
                                 scores=scores, version_url=run.version_url)
    write_manifest_and_latest(run.root, manifest)
    return manifest

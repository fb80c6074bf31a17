"""Incremental rebuilds: the driver of `maskstream update` (and of each rebuild of `watch`).

Per-file results, wordfreq lookups and word embeddings are cached beside the dataset root
(cache.py holds the layout, the keys and the part folders); the word encoder runs in a process of
its own (encoder_process.py).

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

import dataclasses
import functools
import gc
import json
import logging
import logging.handlers
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from maskstream.pipelines.dataset.dataset_writer import join, write_atomically
from maskstream.pipelines.lifecycle.cache import (
    CACHE_DIR,
    FILES_DIR,
    FileEntry,
    FileSettings,
    cached_words,
    complete_entries,
    count_and_tokenize_file,
    encoder_key,
    file_settings,
    general_frequencies,
    parse_file,
    read_embeddings,
    read_entry,
    write_embeddings_part,
)
from maskstream.pipelines.lifecycle.encoder_process import EncoderLoader

LOG = logging.getLogger("maskstream.update")

IO_THREADS = 4  # cache reads and shard writes at once


# ---------------------------------------------------------------- the update


@dataclasses.dataclass
class UpdateOptions:
    inputs: list[str]
    root: str
    build: Any  # maskstream.pipelines.dataset.build_steps.BuildConfig
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
    from maskstream.pipelines.statistics.tf_icf import word_stats_row, wordfreq_floor

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
    from maskstream.pipelines.dataset.build_steps import sequence_ids, sequence_offsets, unit_counts
    from maskstream.pipelines.dataset.sequences import (
        WINDOWS_SCHEMA,
        cut_windows,
        flat,
        list_column,
        pack_documents,
        sort_documents,
    )
    from maskstream.pipelines.dataset.tokenizer_facts import (
        load_backend_tokenizer,
        pack_separator,
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


def leased_update(options: UpdateOptions) -> dict[str, Any]:
    """`incremental.update(options)` holding a lease (schemas/lease.py) on the version it writes, so
    `maskstream gc` leaves the incomplete version, and the cache it fills, alone however long it takes."""
    import dataclasses

    from maskstream.pipelines.dataset.dataset_writer import join, new_version_name
    from maskstream.schemas.lease import VersionLease

    options = dataclasses.replace(options, version=options.version or new_version_name())
    lease = VersionLease(join(options.root, options.version))
    try:
        return update(options)
    finally:
        lease.release()


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
    config: Any  # maskstream.pipelines.dataset.build_steps.BuildConfig
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
    from maskstream.pipelines.corpus import corpus_fingerprint
    from maskstream.pipelines.dataset.dataset_writer import new_version_name, prepare_version

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
        from maskstream.pipelines.dataset.tokenizer_facts import load_backend_tokenizer

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

    from maskstream.pipelines.dataset.build_steps import pipeline_counters
    from maskstream.pipelines.lifecycle.process_files import ProcessFiles

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
    index: Any  # maskstream.pipelines.dataset.word_lookup.WordLookup: word -> word_index
    encoded: list[str]


def stats_and_seeds(entries: Sequence[FileEntry], options: UpdateOptions, config: Any, cache_url: str) -> Statistics:
    """`maskstream stats` and `seeds` on the merged per-file counts; the words to encode."""
    from maskstream.pipelines.dataset.build_steps import vocabulary_index
    from maskstream.pipelines.dataset.vocabulary import encoded_words
    from maskstream.pipelines.statistics.seed_selection import load_stop_words, select_seeds

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
    from maskstream.pipelines.dataset.build_steps import score_words, word_scores

    encoded = statistics.encoded
    scored = score_words(encoded, np.stack([embeddings[w] for w in encoded]),
                         [(seed, embeddings[seed]) for seed in statistics.seeds], reduce, statistics.index)
    return word_scores([scored], len(statistics.index), statistics.seeds)


def write_shards(run: UpdateRun, windows: pa.Table, similarity: np.ndarray) -> tuple[list, dict | None]:
    """Rows, mask probabilities and the shard files of `windows` (in sequence-id order); returns
    the shard entries and the merged signal tallies."""
    from maskstream.pipelines.dataset.build_steps import (
        sequence_rows,
        shard_bounds,
        shard_count,
        signal_tally,
    )
    from maskstream.pipelines.dataset.dataset_writer import write_shard
    from maskstream.pipelines.dataset.signal import merge_map_tallies

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
    from maskstream.pipelines.dataset.build_steps import (
        assemble_manifest,
        manifest_fields,
        vocabulary_counts,
        vocabulary_tally,
        word_table_rows,
        word_table_shards,
        write_rejects,
        write_word_table_shard,
    )
    from maskstream.pipelines.dataset.dataset_writer import write_manifest_and_latest
    from maskstream.schemas.formulas import FORMULA_VERSIONS
    from maskstream.schemas.manifest import SEEDS_NAME

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

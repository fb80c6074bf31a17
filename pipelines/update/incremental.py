"""Incremental rebuilds: the driver of `maskstream update` (and of each rebuild of `watch`).

`update()` fingerprints the corpus and then runs the build's steps (pipelines/dataset/steps.py)
in one process, stage by stage:
- the files without a cache entry are counted and tokenized (changed_files.py);
- the cache's per-file counts are merged into the statistics, the seeds and the words the encoder
  sees (merged_statistics.py), as `maskstream stats` and `seeds` compute them;
- the words the embedding cache lacks are encoded in the encoder's own process (encoder_process.py),
  started as soon as a counted file brings such a word, while this process cuts the windows;
- the windows (the build's one windowing rule, `sequences.windows`), the nearest-seed similarities,
  the mask probabilities and the shards, then the word table, seeds.json and, last, the manifest;
- with `--peer-signals`, each file's peer counts (peer_counts.py), summed and scored into the
  version's collocations and informativeness.

So an update with a warm cache writes the same rows as one with an empty cache, and as `maskstream
build` of the same corpus in either packing mode. The caches' layout, keys and compaction are
cache.py's. Python's cyclic garbage collector is paused for the update.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.pipelines.corpus import corpus_fingerprint
from maskstream.pipelines.dataset.core.sequences import (
    WINDOWS_SCHEMA,
    flat,
    list_column,
    split_by_pack_group,
    window_template,
    windows,
)
from maskstream.pipelines.dataset.core.signal_tallies import merge_map_tallies
from maskstream.pipelines.dataset.core.vocabulary import WordScores
from maskstream.pipelines.dataset.steps import (
    BuildConfig,
    assemble_manifest,
    document_counts,
    manifest_fields,
    sequence_ids,
    sequence_offsets,
    sequence_rows,
    shard_bounds,
    shard_count,
    signal_tally,
    unit_counts,
    vocabulary_counts,
    vocabulary_tally,
    word_table_rows,
    word_table_shards,
    write_rejects,
    write_word_table_shard,
)
from maskstream.pipelines.dataset.storage.dataset_writer import (
    join,
    new_version_name,
    prepare_version,
    write_manifest_and_latest,
    write_shard,
)
from maskstream.pipelines.statistics.seeds import write_seeds_json
from maskstream.pipelines.update.cache import (
    CACHE_DIR,
    IO_THREADS,
    FileEntry,
    FileSettings,
    cached_words,
    complete_entries,
    encoder_key,
    file_settings,
    read_embeddings,
    read_entry,
    write_embeddings_part,
)
from maskstream.pipelines.update.changed_files import count_and_tokenize, in_process
from maskstream.pipelines.update.encoder_process import EncoderLoader
from maskstream.pipelines.update.memory import check_memory
from maskstream.pipelines.update.merged_statistics import (
    Statistics,
    merged_statistics,
    update_seeds_document,
    word_similarity,
)
from maskstream.pipelines.update.options import UpdateOptions
from maskstream.pipelines.update.peer_counts import count_peer_files, write_merged_peer_signals
from maskstream.schemas.manifest import SEEDS_NAME, Manifest
from maskstream.storage.lease import VersionLease

LOG = logging.getLogger("maskstream.update")


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
    """`update(options)` holding a lease (maskstream/storage/lease.py) on the version it writes, so `maskstream gc`
    leaves the incomplete version, and the cache it fills, alone however long it takes."""
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
    """The build's steps (pipelines/dataset/steps.py) in one process, stage by stage."""
    clock = StageClock()
    run = start_update(options)
    clock.lap("fingerprint")
    count_changed_files(run)
    clock.lap("count_and_tokenize")
    if options.peer_signals is not None:  # the files whose entries lack them (all, the first time)
        run.counters["files_peer_counted"] = count_peer_files(run.cache_url, run.keys, options.text_field,
                                                              options.txt_mode)
        clock.lap("peer_counts")
    check_memory(run.cache_url, run.keys)
    entries = read_cache(run)
    for entry in entries:  # files a Beam pipeline counted
        if entry.key in run.processed:
            start_encoder_if_new_words(run, entry.words.column("word"))
    clock.lap("read_cache")
    statistics = merged_statistics(entries, options.seed_filters(), options.general_language, options.unseen_count,
                                   run.config.min_word_count, run.cache_url, options.inputs)
    clock.lap("stats_and_seeds")
    embeddings_of = embed_words(run, statistics)
    # The windows need no embedding: cut while the encoder's process loads and encodes.
    windows = windows_of(entries, statistics.index, run.config, statistics.documents)
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
    config: BuildConfig
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


def count_changed_files(run: UpdateRun) -> None:
    """A cache entry for every input file that has none (changed_files.py)."""
    complete = complete_entries(run.cache_url)
    missing = {path: key for path, key in run.keys.items() if key not in complete}
    changed = sum(f["bytes"] for f in run.fingerprint["files"] if f["path"] in missing)
    LOG.info("%s: %d input files, %d cached, %d to count and tokenize (%.1f MB, %s)", run.version_url,
             len(run.keys), len(run.keys) - len(missing), len(missing), changed / 1e6,
             "in this process" if in_process(changed) else "a Beam pipeline")
    run.counters["bytes_changed"] = changed
    run.processed = set(missing.values())
    if missing:
        options = run.options
        run.counters.update(count_and_tokenize(
            missing, changed, run.cache_url, run.config, options.text_field, options.txt_mode, options.beam_args,
            counted=lambda words: start_encoder_if_new_words(run, words)))


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


def read_cache(run: UpdateRun) -> list[FileEntry]:
    """Every input file's cache entry, in path order."""
    # Threads: reading and decoding Parquet releases the GIL (local disk or gs://).
    with ThreadPoolExecutor(IO_THREADS) as pool:
        return list(pool.map(lambda path: read_entry(run.cache_url, path, run.keys[path]), sorted(run.keys)))


def windows_of(entries: Sequence[FileEntry], index: WordLookup, config: BuildConfig, documents: int) -> pa.Table:
    """Every window of the corpus (WINDOWS_SCHEMA) in sequence-id order: the files' tokenized
    documents with this version's word_index, cut by the build's windowing rule (packing groups over
    the whole corpus, as `maskstream build` forms them)."""
    tables = []
    for entry in entries:
        if entry.tokenized.num_rows == 0:
            continue
        # The file's own word list -> this version's word table rows (a local -1 hits the trailing -1).
        to_global = np.append(index.index_of(entry.words.column("word").to_pylist()), np.int32(-1))
        local, offsets = flat(entry.tokenized, "word_index")
        tables.append(entry.tokenized.set_column(
            entry.tokenized.schema.get_field_index("word_index"), "word_index",
            list_column(to_global[local], offsets, pa.int32())))
    if not tables:
        return WINDOWS_SCHEMA.empty_table()
    tokenized, template = pa.concat_tables(tables), window_template(config.tokenizer)
    if config.packing == "pack":
        units = split_by_pack_group(tokenized, documents, config.pack_group_size)
        cut = pa.concat_tables([windows(table, unit, template, config.max_length, "pack") for unit, table in units])
    else:
        cut = windows(tokenized, "", template, config.max_length, "truncate")
    # The build's own numbering, so that both order the rows alike.
    ids = sequence_ids(cut, sequence_offsets([unit_counts(cut)]))
    return cut.take(np.argsort(ids, kind="stable"))


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


def write_shards(run: UpdateRun, windows: pa.Table, similarity: np.ndarray) -> tuple[list, dict | None]:
    """Rows, mask probabilities and the shard files of `windows` (in sequence-id order); returns
    the shard entries and the merged signal tallies."""
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


def write_version(run: UpdateRun, entries: Sequence[FileEntry], statistics: Statistics, scores: WordScores,
                  shards: list, tallies: dict | None) -> Manifest:
    """The word table, rejects, seeds.json and, last, the manifest and `latest`; returns the manifest."""
    options, config = run.options, run.config
    shards_of_words = word_table_shards(len(statistics.index))
    for shard, rows in word_table_rows(statistics.vocabulary, statistics.index, scores):  # each shard once
        write_word_table_shard(run.version_url, shard, shards_of_words, [rows])
    vocabulary = vocabulary_counts(vocabulary_tally(statistics.vocabulary, statistics.tf, config.min_word_count,
                                                    statistics.seeds), config.min_word_count)
    rejects = [r for entry in entries for r in entry.rejects]
    no_tokens = sum(1 for r in rejects if r["reason"] == "no tokens")
    documents = document_counts(statistics.documents, len(rejects) - no_tokens, no_tokens)
    write_rejects(run.version_url, rejects)
    peer_signals = None
    if options.peer_signals is not None:
        peer_signals = write_merged_peer_signals(run.cache_url, [run.keys[path] for path in sorted(run.keys)],
                                                 statistics.index, run.version_url, options.peer_signals)
    write_seeds_json(join(run.version_url, SEEDS_NAME), update_seeds_document(
        statistics, options.seed_filters(), options.stats_config(), run.fingerprint))
    fields = manifest_fields(
        run.version, config, statistics.seeds, run.fingerprint,
        {"input": list(options.inputs), "seeds_config": options.seed_filters(),
         "general_language": options.general_language, "unseen_count": options.unseen_count,
         "text_field": options.text_field, "txt_mode": options.txt_mode, "documents": statistics.documents,
         "total_words": statistics.total_words, "file_cache_settings": run.settings.key(),
         "embedding_cache": run.embedding_key,
         "beam_args": list(options.beam_args)})
    manifest = assemble_manifest(fields, shards, **documents, extra_files=[], tallies=tallies, vocabulary=vocabulary,
                                 lookup=statistics.index, scores=scores, version_url=run.version_url,
                                 peer_signals=peer_signals)
    write_manifest_and_latest(run.root, manifest)
    return manifest

"""The `maskstream build` pipeline as composite transforms; each step's work is a function of
pipelines/dataset/build_steps.py, which `maskstream update` calls in one process as well.

    vocabulary --ScoreWords (EmbedWords, NearestSeed, SkippedWords)--> word table, embeddings
    corpus --TokenizeToWindows, StageWindows--> VERSION/_parts/windows/ + unit counts
    unit counts --AssignSequenceIds--> first id per unit, shard count
    windows + word table + ids --MaskAndShard--> VERSION/_parts/ --> shards, signal tallies
    documents + rejects --Bookkeeping--> VERSION/rejects-*.jsonl, accepted and rejected counts
    shards + word table + counts + tallies --WriteManifest--> manifest.json, then ROOT/latest

Windows are Arrow tables of a whole batch of documents (flat arrays, no per-token Python
objects). They wait for their sequence ids, and the finished rows for their shard, in Arrow
files under VERSION/_parts/ (removed before the manifest is written): the runner moves and
holds only file names and per-unit window counts, never the tokens.

`sequence_id` is dense 0..rows-1 and deterministic: windows are ordered by (unit, window
index), where the unit is the document id (truncate) or the packing group (pack), so the ids do
not depend on how many workers ran or in what order. Shard i holds a contiguous id range.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines.dataset.build_steps import (  # noqa: F401 (sequence ids and shards: re-exported, used by tests)
    REJECTS_PREFIX,
    BuildConfig,
    assemble_manifest,
    probability_options,
    sequence_ids,
    sequence_offsets,
    sequence_rows,
    shard_count,
    shard_of,
    signal_tally,
    similarity_array,
    unit_counts,
    unit_keys,
    vocabulary_index,
)
from pipelines.dataset.dataset_writer import (
    embeddings_table,
    join,
    write_manifest_and_latest,
    write_parquet,
    write_shard,
    write_word_table,
)
from pipelines.dataset.embeddings import EmbedWords, ScoreWords, WordEncoderHandler, word_batches
from pipelines.dataset.sequences import TokenizeToWindows
from pipelines.dataset.signal import merge_map_tallies
from pipelines.dataset.vocabulary import complete_word_table
from schemas.manifest import ShardEntry
from schemas.tables import WORD_TABLE_SCHEMA


def _elapsed_ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


class ScoreVocabulary(beam.PTransform):
    """PCollection of one vocabulary (word -> word-table row) -> every word and seed encoded once
    (their union), and each word scored against the seeds.

    Returns {"word_table": tables of WORD_TABLE_SCHEMA rows, "embeddings": (word, vector)}. The
    vocabulary reaches the steps as a side input, not inside their pickled code.
    """

    def __init__(self, seeds: Sequence[str], handler: WordEncoderHandler, reduce: str):
        super().__init__()
        self._seeds = list(seeds)
        self._handler = handler
        self._reduce = reduce

    def expand(self, vocabulary):
        seeds, handler = frozenset(self._seeds), self._handler
        embeddings = (
            vocabulary
            # Words of one token count per batch, batches of the handler's fixed shape: see `word_batches`.
            | "UniqueWordsAndSeeds" >> beam.FlatMap(
                lambda index: word_batches(index.keys() | seeds, handler.model_name, handler.batch_rows,
                                           handler.max_word_tokens)).with_output_types(list[str])
            | "SpreadBatches" >> beam.Reshuffle()
            | "EmbedWords" >> EmbedWords(handler)
        )
        seed_embeddings = embeddings | "SeedEmbeddings" >> beam.Filter(lambda pair: pair[0] in seeds)
        word_table = (
            embeddings
            | "BatchWords" >> beam.BatchElements(min_batch_size=1, max_batch_size=4096)
            | "NearestSeed" >> beam.ParDo(ScoreWords(self._reduce), beam.pvalue.AsList(seed_embeddings),
                                          beam.pvalue.AsSingleton(vocabulary))
        )
        return {"word_table": word_table, "embeddings": embeddings}


def concat_word_tables(tables: Iterable[pa.Table]) -> pa.Table:
    return pa.concat_tables([WORD_TABLE_SCHEMA.empty_table(), *tables])


PARTS_DIR = "_parts"  # windows and rows on their way to a shard, removed once the shards are written


def part_path(version_url: str, shard: int, first_sequence_id: int) -> str:
    """Where one batch's rows of `shard` wait (a deterministic name: a retried bundle rewrites it)."""
    return join(version_url, PARTS_DIR, f"shard-{shard:05d}", f"rows-{first_sequence_id:012d}.arrow")


def write_part(table: pa.Table, url: str) -> None:
    import fsspec

    with fsspec.open(url, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)


def read_part(url: str) -> pa.Table:
    import fsspec

    with fsspec.open(url, "rb") as f:
        return pa.ipc.open_file(pa.BufferReader(f.read())).read_all()


def stage_windows(windows: pa.Table, version_url: str) -> tuple[str, pa.Table]:
    """Writes a table of windows to VERSION/_parts/windows/; returns (its path, its `unit_counts`).

    The windows wait for their sequence ids in a file, so the runner materializes only the path
    and the counts, not every token. The name hashes the table's units (a retried bundle
    rewrites the same file)."""
    units = "\n".join(windows.column("unit").unique().to_pylist())
    url = join(version_url, PARTS_DIR, "windows", f"{hashlib.sha256(units.encode('utf-8')).hexdigest()[:24]}.arrow")
    write_part(windows, url)
    return url, unit_counts(windows)



class ComputeRows(beam.DoFn):
    """A staged table of windows (`stage_windows`) -> its rows (sequence ids, mask probabilities),
    written as one Arrow part file per shard it touches; yields (shard, part path), and the
    rows' signal tallies (`pipelines.dataset.signal.map_tallies`) on the output tagged TALLY.

    The rows go through files rather than through the GroupByKey: the runner then never holds
    the whole dataset in memory, only the part names.
    """

    TALLY = "tally"

    def __init__(self, version_url: str, config: BuildConfig):
        self._version_url = version_url
        self._config = config
        self._ms = beam.metrics.Metrics.counter("build", "mask_probability_ms")
        self._rows = beam.metrics.Metrics.counter("build", "sequences")
        self._signal_ms = beam.metrics.Metrics.counter("build", "signal_ms")

    def process(self, staged: tuple[str, pa.Table], similarity: np.ndarray, offsets: dict[str, Any], shards: int):
        started = time.perf_counter()
        windows = read_part(staged[0])
        ids = sequence_ids(windows, offsets)
        rows = sequence_rows(windows, ids, similarity, self._config)
        shard = shard_of(ids, shards, offsets["total"])
        for index in np.unique(shard):
            selected = shard == index
            url = part_path(self._version_url, int(index), int(ids[selected].min()))
            write_part(rows.filter(pa.array(selected)), url)
            yield int(index), url
        self._rows.inc(windows.num_rows)
        self._ms.inc(_elapsed_ms(started))
        started = time.perf_counter()
        yield beam.pvalue.TaggedOutput(self.TALLY, signal_tally(rows, similarity, self._config, offsets["total"]))
        self._signal_ms.inc(_elapsed_ms(started))


class MergeTallies(beam.CombineFn):
    """Sums signal tallies per map (`pipelines.dataset.signal.merge_map_tallies`); None when there is none."""

    def create_accumulator(self):
        return None

    def add_input(self, accumulator, tally):
        return tally if accumulator is None else merge_map_tallies([accumulator, tally])

    def merge_accumulators(self, accumulators):
        present = [a for a in accumulators if a is not None]
        return merge_map_tallies(present) if present else None

    def extract_output(self, accumulator):
        return accumulator


class WriteShardFn(beam.DoFn):
    """(shard, part paths) -> the shard file, in sequence-id order. The parts stay until the
    manifest step removes them all, so a retried bundle still finds them."""

    def __init__(self, version_url: str, row_group_rows: int):
        self._version_url, self._row_group_rows = version_url, row_group_rows
        self._ms = beam.metrics.Metrics.counter("build", "write_ms")

    def process(self, element: tuple[int, Iterable[str]], shards: int):
        started = time.perf_counter()
        index, urls = element
        urls = sorted(set(urls))
        yield write_shard(self._version_url, index, shards, [read_part(url) for url in urls], self._row_group_rows)
        self._ms.inc(_elapsed_ms(started))


def write_embeddings(version_url: str, pairs: Iterable[tuple[str, np.ndarray]]) -> str:
    write_parquet(embeddings_table(dict(pairs)), join(version_url, "embeddings.parquet"), 100_000)
    return "embeddings.parquet"


class ScoreWordTable(beam.PTransform):
    """{"vocabulary", "encoded"} (a word -> word_index dict each) -> {"word_table", "embeddings"}.

    The word table is one table of every word of the vocabulary (the encoded ones scored against
    the seeds, the others the fallback); the embeddings are (word, vector) of every word and seed
    encoded."""

    def __init__(self, seeds: Sequence[str], handler: WordEncoderHandler, reduce: str):
        super().__init__()
        self._seeds, self._handler, self._reduce = list(seeds), handler, reduce

    def expand(self, words):
        scored = words["encoded"] | "ScoreVocabulary" >> ScoreVocabulary(self._seeds, self._handler, self._reduce)
        # A few dozen tables, not a row object per word: cheap for the runner to hand around.
        word_table = (scored["word_table"] | "WordTables" >> beam.combiners.ToList()
                      | "OneWordTable" >> beam.Map(concat_word_tables)
                      | "SkippedWords" >> beam.Map(complete_word_table, beam.pvalue.AsSingleton(words["vocabulary"])))
        return {"word_table": word_table, "embeddings": scored["embeddings"]}


class AssignSequenceIds(beam.PTransform):
    """Staged windows (path, unit counts) -> {"offsets": first sequence id per unit, "shards": their count}."""

    def __init__(self, num_shards: int, shard_rows: int):
        super().__init__()
        self._num_shards, self._shard_rows = num_shards, shard_rows

    def expand(self, staged):
        offsets = (
            staged
            | "UnitCounts" >> beam.Map(lambda path_and_counts: path_and_counts[1])
            | "AllUnits" >> beam.combiners.ToList()
            | "FirstIdPerUnit" >> beam.Map(sequence_offsets)
        )
        # No sequence at all (every document rejected): no shard, and WriteManifest writes no manifest.
        shards = offsets | "ShardCount" >> beam.Map(
            lambda offsets: shard_count(offsets, self._num_shards, self._shard_rows) if offsets["total"] else 0)
        return {"offsets": offsets, "shards": shards}


class MaskAndShard(beam.PTransform):
    """Staged windows -> {"shards": a ShardEntry per shard written, "tallies": the merged signal tallies}."""

    def __init__(self, version_url: str, config: BuildConfig, similarity, numbering: dict[str, Any]):
        super().__init__()
        self._version_url, self._config = version_url, config
        self._similarity, self._numbering = similarity, numbering

    def expand(self, staged):
        shards = beam.pvalue.AsSingleton(self._numbering["shards"])
        computed = staged | "MaskProbabilities" >> beam.ParDo(
            ComputeRows(self._version_url, self._config),
            beam.pvalue.AsSingleton(self._similarity),
            beam.pvalue.AsSingleton(self._numbering["offsets"]),
            shards,
        ).with_outputs(ComputeRows.TALLY, main="parts")
        entries = (
            computed["parts"]
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(WriteShardFn(self._version_url, self._config.row_group_rows), shards)
        )
        tallies = computed[ComputeRows.TALLY] | "MergeTallies" >> beam.CombineGlobally(MergeTallies())
        return {"shards": entries, "tallies": tallies}


def document_counts(_, documents: int, read_rejects: int, no_tokens: int) -> dict[str, int]:
    """Documents read = accepted + rejected; a document that yields no token was read and is rejected."""
    return {"read": documents + read_rejects, "accepted": documents - no_tokens, "rejected": read_rejects + no_tokens}


class Bookkeeping(beam.PTransform):
    """{"documents", "rejects", "no_tokens"} -> {"documents": {read, accepted, rejected}, "rejects_written"}.

    "rejects" are ReadCorpus's, "no_tokens" TokenizeToWindows'; "rejects_written" are the names
    of the VERSION/rejects-*.jsonl files. Rejects are written in as many files as the runner chooses and counted with a combine, so no
    worker holds them all, whatever share of the corpus they are."""

    def __init__(self, version_url: str):
        super().__init__()
        self._version_url = version_url

    def expand(self, corpus):
        counts = {name: corpus[name] | f"Count{name.title().replace('_', '')}" >> beam.combiners.Count.Globally()
                  for name in ("documents", "rejects", "no_tokens")}
        written = (
            (corpus["rejects"], corpus["no_tokens"])
            | "AllRejects" >> beam.Flatten()
            | "RejectsToJson" >> beam.Map(json.dumps, ensure_ascii=False)
            | "WriteRejects" >> beam.io.WriteToText(join(self._version_url, REJECTS_PREFIX), file_name_suffix=".jsonl")
        )
        documents = (
            corpus["documents"].pipeline
            | "Once" >> beam.Create([None])
            | "DocumentCounts" >> beam.Map(document_counts, beam.pvalue.AsSingleton(counts["documents"]),
                                           beam.pvalue.AsSingleton(counts["rejects"]),
                                           beam.pvalue.AsSingleton(counts["no_tokens"]))
        )
        return {"documents": documents, "rejects_written": written}


def finalize(_, root: str, fields: dict[str, Any], shards: list[ShardEntry], word_table: pa.Table,
             documents: dict[str, int], tallies: dict[str, Any] | None, extra_files: list, written: list) -> str | None:
    """Runs once, after every shard and file is written (`written`): the manifest, then `latest`.
    Writes no manifest when no document gave a sequence (the caller reports it)."""
    import fsspec

    fs, parts = fsspec.core.url_to_fs(join(root, fields["version"], PARTS_DIR))
    if fs.exists(parts):  # every shard is written: the windows and rows waiting for them can go
        fs.rm(parts, recursive=True)
    if not shards:
        return None
    manifest = assemble_manifest(fields, shards, **documents, extra_files=extra_files, tallies=tallies,
                                 word_table=word_table)
    return write_manifest_and_latest(root, manifest)


class WriteManifest(beam.PTransform):
    """PBegin + shards, word table, counts, tallies (side inputs) -> manifest.json, then ROOT/latest.

    Runs once every file named in `written` exists."""

    def __init__(self, root: str, fields: dict[str, Any], **inputs):
        super().__init__()
        self._root, self._fields, self._inputs = root, fields, inputs

    def expand(self, pbegin):
        inputs = self._inputs
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "WriteManifest" >> beam.Map(
                finalize, root=self._root, fields=self._fields,
                shards=beam.pvalue.AsList(inputs["shards"]),
                word_table=beam.pvalue.AsSingleton(inputs["word_table"]),
                documents=beam.pvalue.AsSingleton(inputs["documents"]),
                tallies=beam.pvalue.AsSingleton(inputs["tallies"]),
                extra_files=beam.pvalue.AsList(inputs["extra_files"]),
                written=beam.pvalue.AsList(inputs["written"]),
            )
        )


class BuildDataset(beam.PTransform):
    """{"documents", "rejects"} of ReadCorpus -> a complete dataset version under `root`."""

    def __init__(self, config: BuildConfig, vocabulary: Sequence[str], encoded: Sequence[str], seeds: Sequence[str],
                 root: str, manifest_fields: dict[str, Any]):
        super().__init__()
        self._config = config
        self._vocabulary = list(vocabulary)
        self._encoded = list(encoded)  # the words the encoder sees (pipelines/dataset/vocabulary.py)
        self._seeds = list(seeds)
        self._root = root
        self._fields = manifest_fields

    def expand(self, corpus):
        config, pipeline = self._config, corpus["documents"].pipeline
        version_url = join(self._root, self._fields["version"])
        handler = WordEncoderHandler(
            config.encoder, pooling=config.pooling, threads=config.encoder_threads, device=config.encoder_device,
            batch_rows=config.embed_batch_size, dtype=config.encoder_dtype,
        )
        # One element holding the whole mapping (word -> word-table row), typed: Beam neither
        # infers a type per entry nor rebuilds a dict from pairs in every bundle.
        index = vocabulary_index(self._vocabulary)
        vocabulary = pipeline | "Vocabulary" >> beam.Create([index]).with_output_types(dict[str, int])
        encoded = pipeline | "EncodedWords" >> beam.Create([{w: index[w] for w in self._encoded}]).with_output_types(
            dict[str, int])

        scored = {"vocabulary": vocabulary, "encoded": encoded} | "ScoreWords" >> ScoreWordTable(
            self._seeds, handler, config.reduce)
        similarity = scored["word_table"] | "SimilarityArray" >> beam.Map(similarity_array)
        tokenized = corpus["documents"] | "TokenizeToWindows" >> TokenizeToWindows(
            config.tokenizer, beam.pvalue.AsSingleton(vocabulary), max_length=config.max_length,
            packing=config.packing, pack_group_size=config.pack_group_size, batch_size=config.tokenize_batch_size)
        staged = tokenized["windows"] | "StageWindows" >> beam.Map(stage_windows, version_url)
        numbering = staged | "AssignSequenceIds" >> AssignSequenceIds(config.num_shards, config.shard_rows)
        masked = staged | "MaskAndShard" >> MaskAndShard(version_url, config, similarity, numbering)
        books = {**corpus, "no_tokens": tokenized["rejects"]} | "Bookkeeping" >> Bookkeeping(version_url)

        words_written = scored["word_table"] | "WriteWordTable" >> beam.Map(
            lambda table: write_word_table(version_url, self._fields["word_table"], table))
        if config.write_embeddings:
            extra = (scored["embeddings"] | "EmbeddingList" >> beam.combiners.ToList()
                     | "WriteEmbeddings" >> beam.Map(lambda pairs: write_embeddings(version_url, pairs)))
        else:
            extra = pipeline | "NoEmbeddings" >> beam.Create([])
        written = (words_written, books["rejects_written"]) | "FilesWritten" >> beam.Flatten()
        return pipeline | "WriteManifest" >> WriteManifest(
            self._root, self._fields, shards=masked["shards"], word_table=scored["word_table"],
            documents=books["documents"], tallies=masked["tallies"], extra_files=extra, written=written)

"""The `maskstream build` pipeline as composite transforms; each step's work is a function of
pipelines/dataset/steps.py, which `maskstream update` calls in one process as well.

    word stats --ScoreWords (NumberWords, EmbedWords, NearestSeed, WordScores)--> lookup, scores, embeddings
    word stats + lookup + scores --WriteWordTable--> VERSION/words/ shards
    corpus --TokenizeToWindows, StageWindows--> VERSION/_parts/windows/ + unit counts
    unit counts --AssignSequenceIds--> first id per unit, shard count
    windows + word table + ids --MaskAndShard--> VERSION/_parts/ --> shards, signal tallies
    documents + rejects --Bookkeeping--> VERSION/rejects-*.jsonl, accepted and rejected counts
    shards + counts + tallies + lookup + scores --WriteManifest--> manifest.json, then ROOT/latest

The word statistics are read by the workers (ReadWordStats); the vocabulary reaches the other steps
as compact arrays (mask_signal/word_lookup.py: 18 bytes a word type) in side inputs, never in
the job's graph, the launching process or a Python dict.

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
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.pipelines.dataset.beam.embeddings import EmbedWords, NearestSeedRowsFn, WordEncoderHandler
from maskstream.pipelines.dataset.beam.peer_transforms import WritePeerSignals
from maskstream.pipelines.dataset.beam.tokenize_to_windows import TokenizeToWindows
from maskstream.pipelines.dataset.core.signal_tallies import merge_map_tallies
from maskstream.pipelines.dataset.core.vocabulary import WordScores, encoded_mask
from maskstream.pipelines.dataset.steps import (
    REJECTS_PREFIX,
    BuildConfig,
    assemble_manifest,
    collect_word_scores,
    document_counts,
    sequence_ids,
    sequence_offsets,
    sequence_rows,
    shard_count,
    shard_of,
    signal_tally,
    unit_counts,
    vocabulary_counts,
    vocabulary_index,
    vocabulary_tally,
    word_table_rows,
    word_table_shards,
    write_word_table_shard,
)
from maskstream.pipelines.dataset.storage.dataset_writer import (
    embeddings_table,
    join,
    write_manifest_and_latest,
    write_parquet,
    write_shard,
)
from maskstream.pipelines.statistics.peer_formulas import PeerSignalSettings
from maskstream.schemas.manifest import WORD_TABLE_SHARD_ROWS, ShardEntry


def _elapsed_ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


WORD_STATS_BATCH_ROWS = 65_536  # word-stats rows a worker reads at once


def read_word_stats_file(readable) -> Iterator[pa.Table]:
    """One word_stats-*.parquet (a `fileio.ReadableFile`) -> its (word, tf) rows, in record batches."""
    with readable.open() as f:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=WORD_STATS_BATCH_ROWS, columns=["word", "tf"]):
            yield pa.Table.from_batches([batch])


class ReadWordStats(beam.PTransform):
    """The stats folder's word_stats-*.parquet -> PCollection of (word, tf) Arrow tables, matched and
    read by the workers: the vocabulary never passes through the launching process or the graph
    (only the pattern does)."""

    def __init__(self, stats_dir: str):
        super().__init__()
        self._pattern = join(stats_dir, "word_stats-*.parquet")

    def expand(self, pbegin):
        # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
        from apache_beam.io import fileio

        return (
            pbegin
            | "StatsPattern" >> beam.Create([self._pattern])
            | "MatchStats" >> fileio.MatchAll()
            | "SpreadStatsFiles" >> beam.Reshuffle()
            | "OpenStats" >> fileio.ReadMatches()
            | "ReadBatches" >> beam.FlatMap(read_word_stats_file)
        )


class NumberWords(beam.CombineFn):
    """Word columns (Arrow) -> the vocabulary's WordLookup (word_index = rank in word order).

    The accumulator holds the words as Arrow string chunks, no Python object a word: the one place
    a build holds the vocabulary's text at once, to number it as `maskstream build` always did."""

    def create_accumulator(self) -> list[pa.Array]:
        return []

    def add_input(self, accumulator: list[pa.Array], words: pa.Array) -> list[pa.Array]:
        accumulator.append(words)
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[list[pa.Array]]) -> list[pa.Array]:
        return [chunk for accumulator in accumulators for chunk in accumulator]

    def extract_output(self, accumulator: list[pa.Array]) -> WordLookup:
        return vocabulary_index(pa.chunked_array(accumulator, pa.string()))


class SumArrays(beam.CombineFn):
    """Sums numpy arrays of one shape (`vocabulary_tally`s); None for no input."""

    def create_accumulator(self):
        return None

    def add_input(self, accumulator, array):
        return array.copy() if accumulator is None else accumulator + array

    def merge_accumulators(self, accumulators):
        present = [a for a in accumulators if a is not None]
        return sum(present[1:], present[0].copy()) if present else None

    def extract_output(self, accumulator):
        return accumulator


class EncodedWordBatches(beam.DoFn):
    """A table of word statistics -> batches (`word_batches`) of its words the encoder sees
    (`encoded_mask`), seeds left out (they are encoded once, on their own)."""

    def __init__(self, handler: WordEncoderHandler, min_word_count: int, seeds: Sequence[str]):
        self._handler, self._min_word_count, self._seeds = handler, min_word_count, frozenset(seeds)

    def process(self, stats: pa.Table) -> Iterator[list[str]]:
        words = stats.column("word").combine_chunks()
        keep = encoded_mask(words, stats.column("tf").to_numpy(), self._min_word_count, ())
        chosen = [w for w in words.filter(pa.array(keep)).to_pylist() if w not in self._seeds]
        yield from self._handler.encoder.batches(chosen)


def encoded_rows(table: pa.Table) -> pa.Table:
    """What `collect_word_scores` needs of scored rows (the word's text stays behind)."""
    return table.select(["word_index", "similarity", "nearest_seed"])


class ScoreWords(beam.PTransform):
    """Word statistics (tables of word, tf) -> {"lookup": the WordLookup, "scores": the WordScores,
    "vocabulary": the manifest's vocabulary counts, "embeddings": (word, vector) of every word
    and seed encoded}, each encoded once, in parallel over batches of words."""

    def __init__(self, config: BuildConfig, seeds: Sequence[str], handler: WordEncoderHandler):
        super().__init__()
        self._config, self._seeds, self._handler = config, list(seeds), handler

    def expand(self, word_stats):
        config, handler, seeds = self._config, self._handler, self._seeds
        pipeline = word_stats.pipeline
        lookup = (word_stats
                  | "WordColumn" >> beam.Map(lambda stats: stats.column("word").combine_chunks())
                  | "NumberWords" >> beam.CombineGlobally(NumberWords()))
        vocabulary = (
            word_stats
            | "TallyVocabulary" >> beam.Map(lambda stats: vocabulary_tally(
                stats.column("word").combine_chunks(), stats.column("tf").to_numpy(), config.min_word_count, seeds))
            | "SumVocabulary" >> beam.CombineGlobally(SumArrays())
            | "VocabularyCounts" >> beam.Map(vocabulary_counts, config.min_word_count)
        )
        word_batches_ = word_stats | "EncodedWordBatches" >> beam.ParDo(
            EncodedWordBatches(handler, config.min_word_count, seeds))
        # The seeds are few (K): they may live in the graph.
        seed_batches = pipeline | "SeedBatches" >> beam.Create(
            handler.encoder.batches(seeds))
        embeddings = (
            (word_batches_, seed_batches)
            | "AllWordBatches" >> beam.Flatten()
            | "SpreadBatches" >> beam.Reshuffle()
            | "EmbedWords" >> EmbedWords(handler)
        )
        seed_set = frozenset(seeds)
        seed_embeddings = embeddings | "SeedEmbeddings" >> beam.Filter(lambda pair: pair[0] in seed_set)
        scores = (
            embeddings
            | "BatchWords" >> beam.BatchElements(min_batch_size=1, max_batch_size=4096)
            | "NearestSeed" >> beam.ParDo(NearestSeedRowsFn(config.reduce), beam.pvalue.AsList(seed_embeddings),
                                          beam.pvalue.AsSingleton(lookup))
            | "EncodedRows" >> beam.Map(encoded_rows)
            | "AllEncoded" >> beam.combiners.ToList()
            | "WordScores" >> beam.Map(lambda tables, lookup: collect_word_scores(tables, len(lookup), seeds),
                                       beam.pvalue.AsSingleton(lookup))
        )
        return {"lookup": lookup, "scores": scores, "vocabulary": vocabulary, "embeddings": embeddings}


class WriteWordTable(beam.PTransform):
    """Word statistics -> the word table's shards (WORD_TABLE_SHARD_ROWS word types each, by
    word_index), written in parallel; yields their paths."""

    def __init__(self, version_url: str, words: dict[str, Any]):
        super().__init__()
        self._version_url, self._words = version_url, words

    def expand(self, word_stats):
        lookup, scores = beam.pvalue.AsSingleton(self._words["lookup"]), beam.pvalue.AsSingleton(self._words["scores"])
        version_url = self._version_url
        return (
            word_stats
            | "WordTableRows" >> beam.FlatMap(
                lambda stats, lookup, scores: word_table_rows(stats.column("word").combine_chunks(), lookup, scores),
                lookup, scores)
            | "GroupByWordShard" >> beam.GroupByKey()
            | "WriteWordShards" >> beam.Map(
                lambda shard_parts, lookup: write_word_table_shard(
                    version_url, shard_parts[0], word_table_shards(len(lookup)), shard_parts[1]), lookup)
        )


PARTS_DIR = "_parts"  # windows and rows on their way to a shard, removed once the shards are written


def part_path(version_url: str, shard: int, first_sequence_id: int) -> str:
    """Where one batch's rows of `shard` wait (a deterministic name: a retried bundle rewrites it)."""
    return join(version_url, PARTS_DIR, f"shard-{shard:05d}", f"rows-{first_sequence_id:012d}.arrow")


def write_part(table: pa.Table, url: str) -> None:

    with fsspec.open(url, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)


def read_part(url: str) -> pa.Table:

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
    rows' signal tallies (`maskstream.pipelines.dataset.core.signal_tallies.map_tallies`) on the output tagged TALLY.

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
    """Sums signal tallies per map (`maskstream.pipelines.dataset.core.signal_tallies.merge_map_tallies`); None when there is none."""

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


EMBEDDINGS_NAME = "embeddings"  # VERSION/embeddings/embeddings-SSSSS-of-NNNNN.parquet (--write-embeddings)


class WriteEmbeddings(beam.PTransform):
    """(word, vector) pairs -> VERSION/embeddings/ shards, WORD_TABLE_SHARD_ROWS words each by the
    word's word_index (seeds outside the vocabulary in the first), rows sorted by word; yields the folder."""

    def __init__(self, version_url: str, lookup):
        super().__init__()
        self._version_url, self._lookup = version_url, lookup

    def expand(self, embeddings):
        version_url = self._version_url

        def keyed(batch, lookup):
            shard = np.maximum(lookup.index_of([word for word, _ in batch]), 0) // WORD_TABLE_SHARD_ROWS
            for part in np.unique(shard):
                yield int(part), [pair for pair, s in zip(batch, shard, strict=True) if s == part]

        def write(shard_batches, lookup):
            shard, batches = shard_batches
            name = f"{EMBEDDINGS_NAME}/embeddings-{shard:05d}-of-{word_table_shards(len(lookup)):05d}.parquet"
            write_parquet(embeddings_table(dict(pair for batch in batches for pair in batch)), join(version_url, name),
                          100_000)
            return EMBEDDINGS_NAME

        lookup = beam.pvalue.AsSingleton(self._lookup)
        return (
            embeddings
            | "BatchEmbeddings" >> beam.BatchElements(min_batch_size=1, max_batch_size=4096)
            | "EmbeddingShard" >> beam.FlatMap(keyed, lookup)
            | "GroupByEmbeddingShard" >> beam.GroupByKey()
            | "WriteEmbeddingShards" >> beam.Map(write, lookup)
            | "OneFolder" >> beam.Distinct()
        )


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

    def __init__(self, version_url: str, config: BuildConfig, scores, numbering: dict[str, Any]):
        super().__init__()
        self._version_url, self._config = version_url, config
        self._scores, self._numbering = scores, numbering

    def expand(self, staged):
        shards = beam.pvalue.AsSingleton(self._numbering["shards"])
        similarity = self._scores | "SimilarityArray" >> beam.Map(lambda scores: scores.similarity)
        computed = staged | "MaskProbabilities" >> beam.ParDo(
            ComputeRows(self._version_url, self._config),
            beam.pvalue.AsSingleton(similarity),
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
            | "DocumentCounts" >> beam.Map(lambda _, *counts: document_counts(*counts), beam.pvalue.AsSingleton(counts["documents"]),
                                           beam.pvalue.AsSingleton(counts["rejects"]),
                                           beam.pvalue.AsSingleton(counts["no_tokens"]))
        )
        return {"documents": documents, "rejects_written": written}


def finalize(_, root: str, fields: dict[str, Any], shards: list[ShardEntry], documents: dict[str, int],
             tallies: dict[str, Any] | None, vocabulary: dict[str, Any], lookup: WordLookup, scores: WordScores,
             fingerprint: dict[str, Any], extra_files: list, written: list, peer_signals: dict[str, Any]) -> str | None:
    """Runs once, after every shard and file is written (`written`): the manifest, then `latest`.
    Writes no manifest when no document gave a sequence (the caller reports it)."""
    version_url = join(root, fields["version"])
    fs, parts = fsspec.core.url_to_fs(join(version_url, PARTS_DIR))
    if fs.exists(parts):  # every shard is written: the windows and rows waiting for them can go
        fs.rm(parts, recursive=True)
    if not shards:
        return None
    fields = {**fields, "source_fingerprint": fingerprint}
    manifest = assemble_manifest(fields, shards, **documents, extra_files=extra_files, tallies=tallies,
                                 vocabulary=vocabulary, lookup=lookup, scores=scores, version_url=version_url,
                                 peer_signals=peer_signals)
    return write_manifest_and_latest(root, manifest)


class WriteManifest(beam.PTransform):
    """PBegin + shards, counts, tallies, lookup, scores, fingerprint (side inputs) -> manifest.json, then ROOT/latest.

    Runs once every file named in `written` exists."""

    def __init__(self, root: str, fields: dict[str, Any], **inputs):
        super().__init__()
        self._root, self._fields, self._inputs = root, fields, inputs

    def expand(self, pbegin):
        inputs = self._inputs
        singletons = ("documents", "tallies", "vocabulary", "lookup", "scores", "fingerprint", "peer_signals")
        lists = ("shards", "extra_files", "written")
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "WriteManifest" >> beam.Map(
                finalize, root=self._root, fields=self._fields,
                **{name: beam.pvalue.AsSingleton(inputs[name]) for name in singletons},
                **{name: beam.pvalue.AsList(inputs[name]) for name in lists},
            )
        )


class BuildDataset(beam.PTransform):
    """{"documents", "rejects"} of ReadCorpus and the corpus's "fingerprint" (FingerprintFiles) ->
    a complete dataset version under `root`, with the word statistics read from `stats_dir` by the
    workers (nothing per word in the job's graph)."""

    def __init__(self, config: BuildConfig, stats_dir: str, seeds: Sequence[str], root: str,
                 manifest_fields: dict[str, Any], peer_signals: PeerSignalSettings | None = None):
        super().__init__()
        self._config = config
        self._peer_signals = peer_signals
        self._stats_dir = stats_dir
        self._seeds = list(seeds)
        self._root = root
        self._fields = manifest_fields

    def expand(self, corpus):
        config, pipeline = self._config, corpus["documents"].pipeline
        version_url = join(self._root, self._fields["version"])
        handler = WordEncoderHandler(config.word_encoder())
        word_stats = pipeline | "ReadWordStats" >> ReadWordStats(self._stats_dir)
        words = word_stats | "ScoreWords" >> ScoreWords(config, self._seeds, handler)
        tokenized = corpus["documents"] | "TokenizeToWindows" >> TokenizeToWindows(
            config.tokenizer, beam.pvalue.AsSingleton(words["lookup"]), max_length=config.max_length,
            packing=config.packing, pack_group_size=config.pack_group_size, batch_size=config.tokenize_batch_size)
        staged = tokenized["windows"] | "StageWindows" >> beam.Map(stage_windows, version_url)
        numbering = staged | "AssignSequenceIds" >> AssignSequenceIds(config.num_shards, config.shard_rows)
        masked = staged | "MaskAndShard" >> MaskAndShard(version_url, config, words["scores"], numbering)
        books = ({"documents": corpus["documents"], "rejects": corpus["rejects"], "no_tokens": tokenized["rejects"]}
                 | "Bookkeeping" >> Bookkeeping(version_url))
        word_tables = word_stats | "WriteWordTable" >> WriteWordTable(version_url, words)
        if config.write_embeddings:
            extra = words["embeddings"] | "WriteEmbeddings" >> WriteEmbeddings(version_url, words["lookup"])
        else:
            extra = pipeline | "NoEmbeddings" >> beam.Create([])
        if self._peer_signals is not None:
            peer_signals = corpus["documents"] | "PeerSignals" >> WritePeerSignals(
                version_url, self._peer_signals, words["lookup"])
        else:
            peer_signals = pipeline | "NoPeerSignals" >> beam.Create([{}])
        written = (word_tables, books["rejects_written"], extra) | "FilesWritten" >> beam.Flatten()
        return pipeline | "WriteManifest" >> WriteManifest(
            self._root, self._fields, shards=masked["shards"], documents=books["documents"],
            tallies=masked["tallies"], vocabulary=words["vocabulary"], lookup=words["lookup"],
            scores=words["scores"], fingerprint=corpus["fingerprint"], extra_files=extra, written=written,
            peer_signals=peer_signals)

"""The `maskstream build` pipeline as composite transforms.

    corpus --TokenizeToWindows, StageWindows--> VERSION/_parts/windows/ + unit counts ------+
    encoded words --ScoreVocabulary (EmbedWords, NearestSeed), SkippedWords--> word table    |
                                                                                            |
    unit counts --FirstIdPerUnit--> offsets; windows --MaskProbabilities--> VERSION/_parts/ --WriteShards--> shards
    shards + word table + rejects --WriteManifest--> manifest.json, then ROOT/latest

Windows are Arrow tables of a whole batch of documents (flat arrays, no per-token Python
objects). They wait for their sequence ids, and the finished rows for their shard, in Arrow
files under VERSION/_parts/ (removed before the manifest is written): the runner moves and
holds only file names and per-unit window counts, never the tokens.

`sequence_id` is dense 0..rows-1 and deterministic: windows are ordered by (unit, window
index), where the unit is the document id (truncate) or the packing group (pack), so the ids do
not depend on how many workers ran or in what order. Shard i holds a contiguous id range.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines.dataset.dataset_writer import (
    dataset_rows,
    embeddings_table,
    join,
    write_manifest_and_latest,
    write_parquet,
    write_shard,
    write_word_table,
)
from pipelines.dataset.embeddings import EmbedWords, ScoreWords, WordEncoderHandler, word_batches
from pipelines.dataset.sequences import TokenizeToWindows, natural_key
from pipelines.dataset.signal import build_diagnostics, map_tallies, merge_map_tallies
from pipelines.dataset.vocabulary import complete_word_table, token_coverage
from schemas.manifest import Manifest
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


def similarity_array(table: pa.Table) -> np.ndarray:
    """Each word's similarity, at its `word_index`."""
    similarity = np.zeros(table.num_rows, np.float32)
    similarity[table.column("word_index").to_numpy()] = table.column("similarity").to_numpy()
    return similarity


UNIT_COUNTS_SCHEMA = pa.schema([pa.field("unit", pa.string()), pa.field("windows", pa.int64())])


def unit_counts(windows: pa.Table) -> pa.Table:
    """(unit, windows): the number of windows of every unit in a table of windows."""
    counts = windows.group_by("unit").aggregate([("window_index", "count")])
    return pa.table({"unit": counts.column("unit"), "windows": counts.column("window_index_count")},
                    schema=UNIT_COUNTS_SCHEMA)


def unit_keys(units: Sequence[str]) -> np.ndarray:
    """A 64-bit key per unit name (blake2b): fixed width, whatever the names' lengths."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(unit.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                       "little") for unit in units), np.uint64, len(units))


def sequence_offsets(per_table: Iterable[pa.Table]) -> dict[str, Any]:
    """First sequence id of every unit (`unit_counts` tables), numbering the units in natural
    order (ties broken by name), and the total.

    Returned as arrays, units by their `unit_keys` sorted (for `searchsorted`) and their first
    ids: 16 bytes a unit, which Beam sizes and pickles as two buffers, not as a dict of strings."""
    counts = pa.concat_tables([UNIT_COUNTS_SCHEMA.empty_table(), *per_table])
    units = counts.column("unit").to_pylist()
    order = sorted(range(len(units)), key=lambda i: (natural_key(units[i]), units[i]))
    first = np.concatenate([[0], np.cumsum(counts.column("windows").to_numpy()[order], dtype=np.int64)])
    keys = unit_keys([units[i] for i in order])
    by_key = np.argsort(keys, kind="stable")
    keys = keys[by_key]
    if np.any(keys[1:] == keys[:-1]):  # two names with one key (about 1 in 10^7 for a million units)
        raise ValueError("two document or packing-group ids hash to the same 64-bit key; rename one")
    return {"keys": keys, "first": first[:-1][by_key], "total": int(first[-1])}


def sequence_ids(windows: pa.Table, offsets: dict[str, Any]) -> np.ndarray:
    """The `sequence_id` of each window: its unit's first id (`sequence_offsets`) + its index."""
    keys = unit_keys(windows.column("unit").to_pylist())
    position = np.minimum(np.searchsorted(offsets["keys"], keys), max(len(offsets["keys"]) - 1, 0))
    if len(keys) and (len(offsets["keys"]) == 0 or not np.array_equal(offsets["keys"][position], keys)):
        raise KeyError("a window's unit has no sequence offset")
    return offsets["first"][position] + windows.column("window_index").to_numpy().astype(np.int64)


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


def probability_options(config) -> dict[str, Any]:
    """`mask_probabilities_flat`'s options from a `pipelines.dataset.build.BuildConfig`."""
    return {"budget": config.budget, "alpha": config.alpha, "weighting": config.weighting,
            "sharpness": config.sharpness, "floor": config.floor, "width": config.max_length}


class ComputeRows(beam.DoFn):
    """A staged table of windows (`stage_windows`) -> its rows (sequence ids, mask probabilities),
    written as one Arrow part file per shard it touches; yields (shard, part path), and the
    rows' signal tallies (`pipelines.dataset.signal.map_tallies`) on the output tagged TALLY.

    The rows go through files rather than through the GroupByKey: the runner then never holds
    the whole dataset in memory, only the part names.
    """

    TALLY = "tally"

    def __init__(self, version_url: str, config):
        self._version_url = version_url
        self._options = probability_options(config)
        self._config = dataclasses.asdict(config)
        self._ms = beam.metrics.Metrics.counter("build", "mask_probability_ms")
        self._rows = beam.metrics.Metrics.counter("build", "sequences")
        self._signal_ms = beam.metrics.Metrics.counter("build", "signal_ms")

    def process(self, staged: tuple[str, pa.Table], similarity: np.ndarray, offsets: dict[str, Any], shards: int):
        started = time.perf_counter()
        windows = read_part(staged[0])
        ids = sequence_ids(windows, offsets)
        rows = dataset_rows(windows, ids, similarity, **self._options)
        shard = ids * shards // offsets["total"]
        for index in np.unique(shard):
            selected = shard == index
            url = part_path(self._version_url, int(index), int(ids[selected].min()))
            write_part(rows.filter(pa.array(selected)), url)
            yield int(index), url
        self._rows.inc(windows.num_rows)
        self._ms.inc(_elapsed_ms(started))
        started = time.perf_counter()
        yield beam.pvalue.TaggedOutput(self.TALLY, map_tallies(rows, similarity, self._config, offsets["total"]))
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


def shard_count(offsets: dict[str, Any], num_shards: int, shard_rows: int) -> int:
    total = offsets["total"]
    if total == 0:
        raise ValueError("the corpus produced no sequences: nothing to write")
    wanted = num_shards if num_shards > 0 else -(-total // max(shard_rows, 1))
    return max(1, min(wanted, total))


def write_embeddings(version_url: str, pairs: Iterable[tuple[str, np.ndarray]]) -> str:
    write_parquet(embeddings_table(dict(pairs)), join(version_url, "embeddings.parquet"), 100_000)
    return "embeddings.parquet"


def write_rejects(version_url: str, rejects: Iterable[dict[str, str]]) -> int:
    import fsspec

    rejects = sorted(rejects, key=lambda r: (r["source"], r["location"]))
    with fsspec.open(join(version_url, "rejects.jsonl"), "w", encoding="utf-8") as f:
        for reject in rejects:
            f.write(json.dumps(reject, ensure_ascii=False) + "\n")
    return len(rejects)


def finalize(_, root: str, fields: dict[str, Any], shards: list, words: int, rejected: int, accepted: int,
             extra_files: list, signal: dict[str, Any], coverage: dict[str, Any]) -> str:
    """Runs once, after every shard and table is written: the manifest, then `latest`."""
    import fsspec

    fs, parts = fsspec.core.url_to_fs(join(root, fields["version"], PARTS_DIR))
    if fs.exists(parts):  # every shard is written: the windows and rows waiting for them can go
        fs.rm(parts, recursive=True)
    fields = json.loads(json.dumps(fields))
    fields["source_fingerprint"]["documents"] = {"read": accepted + rejected, "accepted": accepted,
                                                 "rejected": rejected}
    fields["config"]["word_types"] = words
    fields["config"]["extra_files"] = sorted(f for f in extra_files if f)
    fields["diagnostics"] = signal
    fields["vocabulary"] = {**fields["vocabulary"], **coverage}
    manifest = Manifest(shards=sorted(shards, key=lambda s: s.path), **fields)
    return write_manifest_and_latest(root, manifest)


class BuildDataset(beam.PTransform):
    """{"documents", "rejects"} of ReadCorpus -> a complete dataset version under `root`."""

    def __init__(self, config, vocabulary: Sequence[str], encoded: Sequence[str], seeds: Sequence[str], root: str,
                 manifest_fields: dict[str, Any]):
        super().__init__()
        self._config = config
        self._vocabulary = list(vocabulary)
        self._encoded = list(encoded)  # the words the encoder sees (pipelines/dataset/vocabulary.py)
        self._seeds = list(seeds)
        self._root = root
        self._fields = manifest_fields

    def expand(self, corpus):
        config = self._config
        pipeline = corpus["documents"].pipeline
        version_url = join(self._root, self._fields["version"])

        handler = WordEncoderHandler(
            config.encoder, pooling=config.pooling, threads=config.encoder_threads, device=config.encoder_device,
            batch_rows=config.embed_batch_size, dtype=config.encoder_dtype,
        )
        # One element holding the whole mapping (word -> word-table row), typed: Beam neither
        # infers a type per entry nor rebuilds a dict from pairs in every bundle.
        index = {w: i for i, w in enumerate(self._vocabulary)}
        vocabulary = pipeline | "Vocabulary" >> beam.Create([index]).with_output_types(dict[str, int])
        encoded = pipeline | "EncodedWords" >> beam.Create([{w: index[w] for w in self._encoded}]).with_output_types(
            dict[str, int])
        scored = encoded | "ScoreVocabulary" >> ScoreVocabulary(self._seeds, handler, config.reduce)
        # A few dozen tables, not a row object per word: cheap for the runner to hand around.
        word_table = (scored["word_table"] | "WordTables" >> beam.combiners.ToList()
                      | "OneWordTable" >> beam.Map(concat_word_tables)
                      | "SkippedWords" >> beam.Map(complete_word_table, beam.pvalue.AsSingleton(vocabulary)))
        similarity = word_table | "SimilarityArray" >> beam.Map(similarity_array)
        tokenized = corpus["documents"] | "TokenizeToWindows" >> TokenizeToWindows(
            config.tokenizer,
            beam.pvalue.AsSingleton(vocabulary),
            max_length=config.max_length,
            packing=config.packing,
            pack_group_size=config.pack_group_size,
            batch_size=config.tokenize_batch_size,
        )
        staged = tokenized["windows"] | "StageWindows" >> beam.Map(stage_windows, version_url)
        offsets = (
            staged
            | "UnitCounts" >> beam.Map(lambda path_and_counts: path_and_counts[1])
            | "AllUnits" >> beam.combiners.ToList()
            | "FirstIdPerUnit" >> beam.Map(sequence_offsets)
        )
        shards = offsets | "ShardCount" >> beam.Map(shard_count, config.num_shards, config.shard_rows)
        computed = staged | "MaskProbabilities" >> beam.ParDo(
            ComputeRows(version_url, config),
            beam.pvalue.AsSingleton(similarity),
            beam.pvalue.AsSingleton(offsets),
            beam.pvalue.AsSingleton(shards),
        ).with_outputs(ComputeRows.TALLY, main="parts")
        seeds = self._seeds
        tallies = computed[ComputeRows.TALLY] | "MergeTallies" >> beam.CombineGlobally(MergeTallies())
        signal = tallies | "SignalDiagnostics" >> beam.Map(
            lambda counts, table: build_diagnostics(counts, table, seeds), beam.pvalue.AsSingleton(word_table))
        coverage = tallies | "TokenCoverage" >> beam.Map(token_coverage, beam.pvalue.AsSingleton(word_table))
        entries = (
            computed["parts"]
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(WriteShardFn(version_url, config.row_group_rows), beam.pvalue.AsSingleton(shards))
        )

        words_written = word_table | "WriteWordTable" >> beam.Map(
            lambda table: write_word_table(version_url, self._fields["word_table"], table))
        all_rejects = (corpus["rejects"], tokenized["rejects"]) | "AllRejects" >> beam.Flatten()
        rejected = (
            all_rejects
            | "RejectList" >> beam.combiners.ToList()
            | "WriteRejects" >> beam.Map(lambda rows: write_rejects(version_url, rows))
        )
        # A document that yields no token is rejected here, after ReadCorpus accepted it.
        accepted = (
            (
                corpus["documents"] | "One" >> beam.Map(lambda _: 1),
                tokenized["rejects"] | "MinusOne" >> beam.Map(lambda _: -1),
            )
            | "AcceptedParts" >> beam.Flatten()
            | "CountAccepted" >> beam.CombineGlobally(sum)
        )
        if config.write_embeddings:
            extra = (
                scored["embeddings"]
                | "EmbeddingList" >> beam.combiners.ToList()
                | "WriteEmbeddings" >> beam.Map(lambda pairs: write_embeddings(version_url, pairs))
            )
        else:
            extra = pipeline | "NoEmbeddings" >> beam.Create([])
        return (
            pipeline
            | "Once" >> beam.Create([None])
            | "WriteManifest"
            >> beam.Map(
                finalize,
                root=self._root,
                fields=self._fields,
                shards=beam.pvalue.AsList(entries),
                words=beam.pvalue.AsSingleton(words_written),
                rejected=beam.pvalue.AsSingleton(rejected),
                accepted=beam.pvalue.AsSingleton(accepted),
                extra_files=beam.pvalue.AsList(extra),
                signal=beam.pvalue.AsSingleton(signal),
                coverage=beam.pvalue.AsSingleton(coverage),
            )
        )

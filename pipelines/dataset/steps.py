"""The build's steps as plain functions, in the order the data flows, for both of its drivers.

`maskstream build` runs them as Beam transforms (pipelines/dataset/beam/dataset_pipeline.py:
BuildDataset), `maskstream update` and `watch` in one process (pipelines/update/incremental.py).
Both call these functions and nothing else for the content of a version, so their outputs are
byte-identical by construction:

    vocabulary_index        word types -> WordLookup (sorted 64-bit hashes -> word_index): every word lookup
    vocabulary_tally        word types and counts -> types and occurrences encoded (summed over batches)
    nearest_seed_rows       encoded words' and seeds' embeddings -> word-table rows (nearest seed)
    collect_word_scores     those rows -> WordScores: similarity and nearest seed per word_index, with
                            the fallback for every word the encoder skipped (pipelines/dataset/core/vocabulary.py)
    word_table_rows         words + WordLookup + WordScores -> WORD_TABLE_SCHEMA rows, by word-table shard
    windows                 (core/sequences.py) tokenized documents -> windows, per packing group in pack mode
    sequence_offsets/_ids   windows' (unit, window index) -> dense sequence ids 0..rows-1
    shard_count, shard_of   rows -> how many shards and which shard a row goes to
    sequence_rows           windows + ids + similarity -> SEQUENCE_SCHEMA rows with mask probabilities
    signal_tally            rows -> their signal tallies (merged over all rows for the diagnostics)
    manifest_fields         what a version's manifest states before the rows exist
    document_counts         documents accepted, read rejects, no-token documents -> read = accepted + rejected
    assemble_manifest       + shards, document counts, tallies and word table -> the Manifest
    write_peer_signals      (`--peer-signals`) the collocation vocabulary and the relevances -> their two tables
    write_rejects           (the in-process driver) rejects -> the file names Beam's text sink gives

Each function works on whole Arrow tables / numpy arrays and knows no runner.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from maskstream.mask_signal.probability import MaskSettings
from maskstream.mask_signal.word_lookup import WordLookup, word_keys
from maskstream.models import MAX_WORD_TOKENS, model_entry
from maskstream.pipelines.dataset.core.peer_tables import (
    collocation_table,
    informativeness_table,
    peer_signals_entry,
)
from maskstream.pipelines.dataset.core.sequences import natural_key
from maskstream.pipelines.dataset.core.signal_tallies import WordsForReport, build_diagnostics, map_tallies
from maskstream.pipelines.dataset.core.tokenizer_facts import tokenizer_facts
from maskstream.pipelines.dataset.core.vocabulary import (
    FALLBACK,
    WordScores,
    check_min_word_count,
    encoded_mask,
    token_coverage,
)
from maskstream.pipelines.dataset.core.word_encoder import DEFAULT_EMBED_BATCH_SIZE, WordEncoder
from maskstream.pipelines.dataset.storage.dataset_writer import (
    dataset_rows,
    join,
    word_table,
    write_parquet,
    write_word_table,
)
from maskstream.pipelines.statistics.peer_formulas import Ngram, PeerSignalSettings, collocation_order
from maskstream.schemas.formulas import FORMULA_VERSIONS
from maskstream.schemas.manifest import (
    COLLOCATIONS_NAME,
    INFORMATIVENESS_NAME,
    WORD_TABLE_FORMAT,
    WORD_TABLE_NAME,
    WORD_TABLE_SHARD_ROWS,
    Manifest,
    ShardEntry,
    read_word_table,
    word_table_shard_name,
)
from maskstream.schemas.tables import WORD_TABLE_SCHEMA

PEER_TABLE_ROW_GROUP_ROWS = 100_000  # collocations.parquet, informativeness.parquet
REJECTS_PREFIX = "rejects"  # VERSION/rejects-SSSSS-of-NNNNN.jsonl, as `maskstream stats` writes its rejects


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Everything that decides a dataset version's content; stored in its manifest. Each field is the
    `maskstream build` flag of the same name (`--help` and docs/building.md say more):

    tokenizer / encoder: the model names or paths that tokenize the text / embed the words.
    max_length: tokens per sequence, specials included (8-512). packing: `truncate` (each document
    into windows) or `pack` (documents joined, cut into full windows); pack_group_size: documents
    packed together. pooling: how a word's token states become its embedding (`mean`, `pooler`).
    reduce: a word's similarity to the seeds (`max`: the nearest seed, `mean`, `centroid`).
    weighting: `similarity` or `rank` (the reference's N - r weights). sharpness / floor: the map's
    exponent on the weights and its least probability of a maskable token. alpha: the share of the
    similarity weights mixed with uniform ones. budget: the expected share of tokens masked.
    num_shards (0: by shard_rows) / shard_rows / row_group_rows: how rows are cut into Parquet
    shards and row groups. tokenize_batch_size / embed_batch_size: documents / words per batch.
    encoder_threads / encoder_device / encoder_dtype: where and how the encoder runs.
    min_word_count: rarer word types are not encoded. write_embeddings: keep the word embeddings
    in the version.
    """

    tokenizer: str
    encoder: str
    max_length: int = MaskSettings.max_length
    packing: str = "truncate"
    pack_group_size: int = 2000
    pooling: str = "mean"
    reduce: str = "max"
    weighting: str = MaskSettings.weighting
    sharpness: float = MaskSettings.sharpness
    floor: float = MaskSettings.floor
    alpha: float = MaskSettings.alpha
    budget: float = MaskSettings.budget
    num_shards: int = 0
    shard_rows: int = 50_000
    row_group_rows: int = 1024
    tokenize_batch_size: int = 1024
    embed_batch_size: int = DEFAULT_EMBED_BATCH_SIZE
    encoder_threads: int = 0
    encoder_device: str = "auto"
    encoder_dtype: str = "float32"  # resolved (`resolve_encoder_dtype`): float32 or bfloat16, never auto
    min_word_count: int = 1  # pipelines/dataset/core/vocabulary.py: rarer word types are not encoded
    write_embeddings: bool = False

    @property
    def mask_settings(self) -> MaskSettings:
        """The options that decide the mask probabilities, as the signal layer takes them."""
        return MaskSettings(**{field.name: getattr(self, field.name) for field in dataclasses.fields(MaskSettings)})

    def __post_init__(self) -> None:
        if not 8 <= self.max_length <= 512:
            raise ValueError(f"--max-length must be between 8 and 512, got {self.max_length}")
        _ = self.mask_settings  # MaskSettings checks the probabilities' ranges (mask_signal/probability.py)
        check_min_word_count(self.min_word_count)

    def word_encoder(self) -> WordEncoder:
        """The word encoder these options describe (the build's RunInference and the update's process)."""
        return WordEncoder(self.encoder, pooling=self.pooling, threads=self.encoder_threads,
                           device=self.encoder_device, batch_rows=self.embed_batch_size, dtype=self.encoder_dtype)


DEFAULTS = BuildConfig(tokenizer="", encoder="")  # the one place the options' defaults are written


def tokenizer_info(name: str) -> dict[str, Any]:
    """What the trainer needs from the tokenizer without loading it."""

    return {**model_entry(name), **tokenizer_facts(name)["info"]}


# ---------------------------------------------------------------- words


def vocabulary_index(words: pa.Array | Sequence[str]) -> WordLookup:
    """The word types (distinct, any order) -> their WordLookup, word_index = rank in word order:
    the one lookup every step of both drivers uses (tokenizing, scoring, mapping a cached file's
    words to this version's). 12 bytes a word type, never a dict of strings."""
    return WordLookup.of(words)


def vocabulary_tally(words: pa.Array, tf: np.ndarray, min_word_count: int, seeds: Iterable[str]) -> np.ndarray:
    """(word types, types encoded, word occurrences, occurrences encoded) of a batch of word
    statistics, to be summed over batches."""
    tf = np.asarray(tf, np.int64)
    encoded = encoded_mask(words, tf, min_word_count, seeds)
    return np.array([len(tf), int(encoded.sum()), int(tf.sum()), int(tf[encoded].sum())], np.int64)


def vocabulary_counts(tally: np.ndarray, min_word_count: int) -> dict[str, Any]:
    """The manifest's `vocabulary` figures from the counts (`vocabulary_tally`, summed): threshold,
    fallback, types and word occurrences encoded."""
    types, encoded, occurrences, covered = (int(n) for n in tally)
    return {
        "min_word_count": min_word_count,
        "fallback": FALLBACK,
        "word_types": types,
        "word_types_encoded": encoded,
        "word_types_skipped": types - encoded,
        "word_occurrences": occurrences,
        "word_occurrences_encoded": covered,
        "word_occurrence_coverage": covered / occurrences if occurrences else 1.0,
    }


REDUCTIONS = ("max", "mean", "centroid")  # --reduce: how a word's cosines to the seeds become one similarity


def _norms(matrix: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix, dtype=np.float64))
    return np.where(norms > 0, norms, 1.0)


def nearest_seed_similarity(
    word_embeddings: np.ndarray, seed_embeddings: np.ndarray, reduce: str = "max"
) -> tuple[np.ndarray, np.ndarray]:
    """(similarity float32 [n], index of the nearest seed int [n]) for each word."""
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    seeds = np.asarray(seed_embeddings, np.float64)
    seeds = seeds / _norms(seeds)[:, None]
    words = np.asarray(word_embeddings).reshape(len(word_embeddings), seeds.shape[1])
    # einsum's own loops (not BLAS), accumulating in float64 without copying the words: each
    # word's sums run in one fixed order, so its score does not depend on how many words share
    # its batch (a build and an update agree bit for bit).
    cosine = np.einsum("ij,kj->ik", words, seeds, dtype=np.float64) / _norms(words)[:, None]
    nearest = cosine.argmax(axis=1)
    if reduce == "max":
        similarity = cosine[np.arange(len(words)), nearest]
    elif reduce == "mean":
        similarity = cosine.mean(axis=1)
    else:
        centroid = seeds.mean(axis=0)
        centroid = centroid / _norms(centroid[None])[0]
        similarity = np.einsum("ij,j->i", words, centroid, dtype=np.float64) / _norms(words)
    return similarity.astype(np.float32), nearest


def nearest_seed_rows(words: Sequence[str], embeddings: np.ndarray, seeds: Iterable[tuple[str, np.ndarray]],
                reduce: str, lookup: WordLookup) -> pa.Table:
    """Words (rows of `embeddings`) scored against the seeds' (word, embedding): WORD_TABLE_SCHEMA
    rows with each word's similarity and nearest seed. The seeds are taken in word order, so the
    nearest of two equally near seeds does not depend on the order they arrived in."""

    seeds = sorted(seeds, key=lambda seed: seed[0])
    seed_words = [word for word, _ in seeds]
    similarity, nearest = nearest_seed_similarity(embeddings, np.stack([e for _, e in seeds]), reduce)
    return word_table(list(words), lookup.index_of(words), similarity, [seed_words[n] for n in nearest])


def collect_word_scores(encoded: Iterable[pa.Table], word_types: int, seeds: Iterable[str]) -> WordScores:
    """Every word type's similarity and nearest seed from the encoded words' rows (`nearest_seed_rows`
    tables, any order); a word the encoder skipped gets the fallback similarity."""

    schema = pa.schema([WORD_TABLE_SCHEMA.field(name) for name in ("word_index", "similarity", "nearest_seed")])
    table = pa.concat_tables([t.select(schema.names).cast(schema) for t in [schema.empty_table(), *encoded]])
    if not table.num_rows:
        raise ValueError("no word type was encoded: lower --min-word-count")
    return WordScores.of(table, word_types, seeds)


def word_table_shards(word_types: int) -> int:
    """How many files the word table of `word_types` types takes (WORD_TABLE_SHARD_ROWS each, at least one)."""
    return max(1, -(-word_types // WORD_TABLE_SHARD_ROWS))


def word_table_rows(words: pa.Array, lookup: WordLookup, scores: WordScores) -> Iterable[tuple[int, pa.Table]]:
    """A batch of word types -> (word-table shard, its WORD_TABLE_SCHEMA rows of the batch)."""

    names = words.to_pylist()
    index = lookup.index_of(names)
    if np.any(index < 0):
        raise KeyError("a word of the statistics is missing from the vocabulary's lookup")
    rows = word_table(names, index, scores.similarity[index], scores.nearest_seeds(index))
    shard = index // WORD_TABLE_SHARD_ROWS
    for part in np.unique(shard):
        yield int(part), rows.filter(pa.array(shard == part))


def write_word_table_shard(version_url: str, shard: int, count: int, parts: Iterable[pa.Table]) -> str:
    """Writes word-table shard `shard` of `count` from its rows (any order), in word_index order;
    returns its path relative to the version."""

    name = word_table_shard_name(shard, count)
    write_word_table(version_url, name, pa.concat_tables([WORD_TABLE_SCHEMA.empty_table(), *parts]))
    return join(name)


# ---------------------------------------------------------------- sequence ids and shards


UNIT_COUNTS_SCHEMA = pa.schema([pa.field("unit", pa.string()), pa.field("windows", pa.int64())])


def unit_counts(windows: pa.Table) -> pa.Table:
    """(unit, windows): the number of windows of every unit in a table of windows."""
    counts = windows.group_by("unit").aggregate([("window_index", "count")])
    return pa.table({"unit": counts.column("unit"), "windows": counts.column("window_index_count")},
                    schema=UNIT_COUNTS_SCHEMA)


def sequence_offsets(per_table: Iterable[pa.Table]) -> dict[str, Any]:
    """First sequence id of every unit (`unit_counts` tables), numbering the units in natural
    order (ties broken by name), and the total.

    Returned as arrays, units by their `word_keys` (blake2b, 64 bits) sorted (for `searchsorted`) and their first
    ids: 16 bytes a unit, which Beam sizes and pickles as two buffers, not as a dict of strings."""

    counts = pa.concat_tables([UNIT_COUNTS_SCHEMA.empty_table(), *per_table])
    units = counts.column("unit").to_pylist()
    order = sorted(range(len(units)), key=lambda i: (natural_key(units[i]), units[i]))
    first = np.concatenate([[0], np.cumsum(counts.column("windows").to_numpy()[order], dtype=np.int64)])
    keys = word_keys([units[i] for i in order])
    by_key = np.argsort(keys, kind="stable")
    keys = keys[by_key]
    if np.any(keys[1:] == keys[:-1]):  # two names with one key (about 1 in 10^7 for a million units)
        raise ValueError("two document or packing-group ids hash to the same 64-bit key; rename one")
    return {"keys": keys, "first": first[:-1][by_key], "total": int(first[-1])}


def sequence_ids(windows: pa.Table, offsets: dict[str, Any]) -> np.ndarray:
    """The `sequence_id` of each window: its unit's first id (`sequence_offsets`) + its index."""
    keys = word_keys(windows.column("unit").to_pylist())
    position = np.minimum(np.searchsorted(offsets["keys"], keys), max(len(offsets["keys"]) - 1, 0))
    if len(keys) and (len(offsets["keys"]) == 0 or not np.array_equal(offsets["keys"][position], keys)):
        raise KeyError("a window's unit has no sequence offset")
    return offsets["first"][position] + windows.column("window_index").to_numpy().astype(np.int64)


def shard_count(offsets: dict[str, Any], num_shards: int, shard_rows: int) -> int:
    """How many shards `offsets["total"]` rows make (--num-shards, else --shard-rows a shard)."""
    total = offsets["total"]
    if total == 0:
        raise ValueError("the corpus produced no sequences: nothing to write")
    wanted = num_shards if num_shards > 0 else -(-total // max(shard_rows, 1))
    return max(1, min(wanted, total))


def shard_of(ids: np.ndarray, shards: int, total: int) -> np.ndarray:
    """The shard of each sequence id: shard i holds the contiguous ids `shard_bounds` gives it."""
    return ids * shards // total


def shard_bounds(total: int, shards: int) -> list[int]:
    """Shard i holds ids [bounds[i], bounds[i + 1]): the first id of each shard under `shard_of`."""
    return [-(-i * total // shards) for i in range(shards + 1)]


# ---------------------------------------------------------------- rows


def sequence_rows(windows: pa.Table, ids: np.ndarray, similarity: np.ndarray, config: BuildConfig) -> pa.Table:
    """Windows and their sequence ids -> SEQUENCE_SCHEMA rows with their mask probabilities."""

    return dataset_rows(windows, ids, similarity, **config.mask_settings.options())


def signal_tally(rows: pa.Table, similarity: np.ndarray, config: BuildConfig,
                 total: int) -> dict[str, dict[str, np.ndarray]]:
    """The signal tallies of rows of a dataset of `total` rows (pipelines/dataset/core/signal_tallies.py)."""

    return map_tallies(rows, similarity, dataclasses.asdict(config), total)


# ---------------------------------------------------------------- the manifest


def manifest_fields(version: str, config: BuildConfig, seeds: Sequence[str], fingerprint: dict[str, Any],
                    run_config: dict[str, Any]) -> dict[str, Any]:
    """What the manifest states before any row is computed: `run_config` (the driver's own inputs
    and options) joins the BuildConfig under `config`."""

    return {
        "version": version,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tokenizer": tokenizer_info(config.tokenizer),
        "encoder": {**model_entry(config.encoder), "pooling": config.pooling, "max_word_tokens": MAX_WORD_TOKENS,
                    "dtype": config.encoder_dtype},
        "seeds": list(seeds),
        "formulas": dict(FORMULA_VERSIONS),
        "config": {**dataclasses.asdict(config), **run_config},
        "source_fingerprint": fingerprint,
        "word_table": WORD_TABLE_NAME,
        "word_table_format": WORD_TABLE_FORMAT,
    }


def document_counts(documents: int, read_rejects: int, no_tokens: int) -> dict[str, int]:
    """Documents read = accepted + rejected, from the documents the reader accepted, the records it
    rejected and the documents that yielded no token (read, then rejected)."""
    return {"read": documents + read_rejects, "accepted": documents - no_tokens, "rejected": read_rejects + no_tokens}


def assemble_manifest(fields: dict[str, Any], shards: Iterable[ShardEntry], *, read: int, accepted: int,
                      rejected: int, extra_files: Iterable[str], tallies: dict[str, Any] | None,
                      vocabulary: dict[str, Any], lookup: WordLookup, scores: WordScores, version_url: str,
                      peer_signals: dict[str, Any] | None = None) -> Manifest:
    """`manifest_fields` + what the rows gave: the shards, documents read = accepted + rejected,
    the word types, the signal diagnostics and the vocabulary's coverage (`vocabulary_counts`, and
    the tokens from the merged tallies). The few words the diagnostics name are read back from the
    word table already written under `version_url`. `peer_signals`: the manifest's entry of the
    peers' signals (`pipelines/dataset/core/peer_tables.py`), when they were computed."""

    fields = json.loads(json.dumps(fields))
    fields["source_fingerprint"]["documents"] = {"read": read, "accepted": accepted, "rejected": rejected}
    fields["config"]["word_types"] = len(lookup)
    fields["config"]["extra_files"] = sorted(f for f in extra_files if f)
    words = WordsForReport(scores.similarity, lookup.index_of, lambda indices: words_of(version_url, fields, indices))
    fields["diagnostics"] = build_diagnostics(tallies, words, fields["seeds"])
    fields["vocabulary"] = {**vocabulary, **token_coverage(tallies, scores)}
    fields["peer_signals"] = dict(peer_signals or {})
    return Manifest(shards=sorted(shards, key=lambda s: s.path), **fields)


def words_of(version_url: str, fields: dict[str, Any], indices: np.ndarray) -> list[str]:
    """The text of the word types `indices` (word_index), read from the version's word table with a filter."""
    # heavy: this pyarrow module loads only when data is read: importing this module stays light
    import pyarrow.dataset as ds

    wanted = pa.array(np.asarray(indices, np.int32))
    table = read_word_table(version_url, fields["word_table"], ["word", "word_index"], ds.field("word_index").isin(wanted))
    text = dict(zip(table.column("word_index").to_pylist(), table.column("word").to_pylist(), strict=True))
    return [text[int(i)] for i in indices]


def write_peer_signals(version_url: str, vocabulary: Iterable[tuple[Ngram, int, float]],
                       relevances: Sequence[tuple[str, int, float]], total_sentences: int, lookup: WordLookup,
                       settings: PeerSignalSettings) -> dict[str, Any]:
    """The collocation vocabulary ((n-gram, count, pmi_n), any order) and the relevances ((word, sentences,
    relevance), any order) as the version's two tables; returns the manifest's `peer_signals` entry."""
    rows = sorted(vocabulary, key=collocation_order, reverse=True)
    words, counts, values = zip(*relevances, strict=True) if relevances else ((), (), ())
    collocations = collocation_table(rows, lookup)
    write_parquet(collocations, join(version_url, COLLOCATIONS_NAME), PEER_TABLE_ROW_GROUP_ROWS)
    write_parquet(informativeness_table(words, counts, values, lookup), join(version_url, INFORMATIVENESS_NAME),
                  PEER_TABLE_ROW_GROUP_ROWS)
    return peer_signals_entry(settings, len(collocations), total_sentences)


def write_rejects(version_url: str, rejects: Iterable[dict[str, str]]) -> int:
    """Writes rejects as one file of Beam's sharded names (VERSION/rejects-00000-of-00001.jsonl),
    sorted by (source, location); returns how many. For the in-process driver: the build writes
    them from the pipeline (BuildDataset's Bookkeeping), in as many files as the runner chooses."""
    # fsspec and its filesystems load only when a path is opened: importing this module stays light
    import fsspec

    rejects = sorted(rejects, key=lambda r: (r["source"], r["location"]))
    with fsspec.open(join(version_url, f"{REJECTS_PREFIX}-00000-of-00001.jsonl"), "w", encoding="utf-8") as f:
        for reject in rejects:
            f.write(json.dumps(reject, ensure_ascii=False) + "\n")
    return len(rejects)


def pipeline_counters(result: Any, namespace: str) -> dict[str, float]:
    """The committed Beam counters of `namespace` in a finished pipeline's result, summed by name."""
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    from apache_beam.metrics.metric import MetricsFilter

    counters: dict[str, float] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]:
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + counter.committed
    return counters

"""The update's caches beside a dataset root, shared by `maskstream update`, `watch` and `gc`.

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
        each update appends one part, and past PARTS_BEFORE_COMPACTION parts they are merged.

Here: the keys, writing and reading one file's entry, and the append-only part folders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import io
import json
import logging
import os
import uuid
from collections import Counter
from collections.abc import Callable
from importlib import metadata
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from maskstream.models import MAX_WORD_TOKENS
from maskstream.pipelines.corpus import Document, FileParser
from maskstream.pipelines.dataset.core.sequences import TOKENIZED_SCHEMA, natural_key, tokenize_documents
from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer, tokenizer_facts
from maskstream.pipelines.dataset.core.word_encoder import DEFAULT_EMBED_BATCH_SIZE
from maskstream.pipelines.dataset.steps import vocabulary_index
from maskstream.pipelines.dataset.storage.dataset_writer import (
    embeddings_table,
    join,
    write_parquet,
)
from maskstream.pipelines.statistics.counting import word_counts_of_texts
from maskstream.schemas.formulas import WORD_NORMALIZATION
from maskstream.schemas.manifest import sha256_file
from maskstream.storage.publish import open_atomically, write_atomically

LOG = logging.getLogger("maskstream.update")

CACHE_DIR = "_cache"
FILES_DIR = "files"
EMBEDDINGS_DIR = "embeddings"
FREQUENCIES_DIR = "general_frequency"  # wordfreq lookups, by language and wordfreq version
ENTRY_NAME = "entry.json"
IO_THREADS = 4  # files read or written at once by the update: cache entries, shards, Parquet footers
CACHE_FORMAT = 2  # bump when what a cache entry holds changes (2: word ids by overlap, maskstream.mask_signal.alignment)


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
        return sha256_text(json.dumps({**dataclasses.asdict(self), "tokenizer": None,
                                       "word_normalization": WORD_NORMALIZATION, "format": CACHE_FORMAT},
                                      sort_keys=True))

    def entry_key(self, path: str, content_sha256: str) -> str:
        return entry_key(self.key(), path, content_sha256)


def entry_key(settings_key: str, path: str, content_sha256: str) -> str:
    """The cache key of one input file (`maskstream gc` recomputes it from a manifest)."""
    return sha256_text(settings_key, path, content_sha256)


def file_settings(tokenizer: str, text_field: str, txt_mode: str) -> FileSettings:
    definition = load_backend_tokenizer(tokenizer).to_str()
    return FileSettings(tokenizer, sha256_text(definition), text_field, txt_mode)


# What a local model folder's embeddings depend on: its weights, its model config and its tokenizer's
# definition. Not the other files, nor fields that record how the folder was saved: transformers
# writes `"local_files_only": true` into a saved tokenizer_config.json under HF_HUB_OFFLINE=1, and its
# own version into config.json.
WEIGHT_SUFFIXES = (".safetensors", ".bin")
INCIDENTAL_CONFIG_FIELDS = ("transformers_version", "_name_or_path")


def encoder_key(encoder: str, pooling: str, dtype: str = "float32", batch_rows: int = DEFAULT_EMBED_BATCH_SIZE) -> str:
    """Identifies word embeddings: the encoder's name, or for a local folder the hash of what its
    embeddings depend on (weights, model config, tokenizer definition: a retrained model in the same
    folder gets a new key, a re-saved one the same), the dtype it ran in and the rows of its batches
    (a batch's shape can change an embedding's last bits). Keys of the defaults, float32 and
    DEFAULT_EMBED_BATCH_SIZE, carry neither."""
    files: tuple = ()
    if os.path.isdir(encoder):
        names = sorted(n for n in os.listdir(encoder) if n.endswith((*WEIGHT_SUFFIXES, ".json", ".txt")))
        stats = [os.stat(os.path.join(encoder, n)) for n in names]
        files = tuple((n, st.st_size, st.st_mtime_ns) for n, st in zip(names, stats, strict=True))
    return _encoder_key(encoder, pooling, dtype, batch_rows, files)


@functools.lru_cache(maxsize=8)
def _encoder_key(encoder: str, pooling: str, dtype: str, batch_rows: int, files: tuple) -> str:
    # Keyed also on each file's size and modification time: a long-running watch hashes a local
    # model's weights once, not on every rebuild, and still sees them replaced.
    parts = [encoder, pooling, str(MAX_WORD_TOKENS)] + ([f"dtype:{dtype}"] if dtype != "float32" else [])
    parts += [f"batch_rows:{batch_rows}"] if batch_rows != DEFAULT_EMBED_BATCH_SIZE else []
    if os.path.isdir(encoder):
        parts[0] = "local"  # the same weights anywhere are the same encoder
        for name, _, _ in files:
            if name.endswith(WEIGHT_SUFFIXES):
                parts.append(f"{name}:{sha256_file(os.path.join(encoder, name))}")  # streamed: weights are large
        parts += [f"config:{model_config_text(encoder)}", f"tokenizer:{sha256_text(tokenizer_definition(encoder))}"]
    return sha256_text(*parts)[:32]


def model_config_text(folder: str) -> str:
    """config.json's settings as canonical JSON, without the fields that record how it was saved."""
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    return json.dumps({k: v for k, v in config.items() if k not in INCIDENTAL_CONFIG_FIELDS}, sort_keys=True)


def tokenizer_definition(folder: str) -> str:
    """The fast tokenizer's definition (normalizer, pre-tokenizer, vocabulary, added tokens): what
    turns a word into the ids the encoder sees."""
    return tokenizer_facts(folder)["backend"] or ""


# ---------------------------------------------------------------- per-file entries


def count_and_tokenize_file(path: str, key: str, documents: list, rejects: list[dict[str, str]], cache_url: str,
                            tokenizer: Any, batch_size: int,
                            counted: Callable[[list[str]], None] | None = None) -> dict[str, int]:
    """Writes the cache entry of one input file from its parsed documents and rejects; returns
    {"documents", "tokens_across_words"}. Counts words exactly as `maskstream stats`
    (`word_counts_of_texts`) and tokenizes exactly as `maskstream build` (`tokenize_documents`),
    in batches. `counted(words)` is called with the file's word types before it is tokenized."""
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

    documents, rejects = [], []
    for record in FileParser(text_field, txt_mode).records(path):
        (documents if isinstance(record, Document) else rejects).append(record)
    return documents, rejects


def write_parquet_file(table: pa.Table, url: str) -> None:
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
    # heavy: wordfreq loads its tables only when general frequencies are read
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


def write_embeddings_part(cache_url: str, key: str, embeddings: dict[str, np.ndarray]) -> None:
    if not embeddings:
        return

    append_part(join(cache_url, EMBEDDINGS_DIR, key), embeddings_table(embeddings))

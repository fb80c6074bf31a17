"""The dataset manifest: what a dataset version holds, and how readers find and trust it.

Layout of a dataset root (local path or `gs://bucket/prefix`):

    ROOT/latest                      text file: the name of the newest complete version
    ROOT/VERSION/manifest.json       written last, atomically; a version without it is incomplete
    ROOT/VERSION/shard-00000-of-000NN.parquet   rows of SEQUENCE_SCHEMA
    ROOT/VERSION/words/words-00000-of-0000N.parquet   WORD_TABLE_SCHEMA, WORD_TABLE_SHARD_ROWS word
                                     types a file by word_index (`word_table_format` 2; format 1,
                                     before 0.2, was one file, words.parquet: `read_word_table` reads both)
    ROOT/VERSION/seeds.json
    ROOT/VERSION/collocations.parquet, informativeness.parquet   the peers' signals (`--peer-signals`)

Every path inside a manifest is relative to its version folder and must stay inside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
from typing import IO, Any

import fsspec

from maskstream.storage.retry import retry_read

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = (1,)
MANIFEST_NAME = "manifest.json"
LATEST_POINTER = "latest"
WORD_TABLE_NAME = "words"  # a folder of word-table shards (format 2)
LEGACY_WORD_TABLE_NAME = "words.parquet"  # format 1: one file
WORD_TABLE_FORMAT = 2
# Word types a word-table file: shard j holds word_index [j * ROWS, (j + 1) * ROWS), so the files do
# not depend on how the build's workers read the statistics, and no worker writes more than this.
WORD_TABLE_SHARD_ROWS = 1_000_000
SEEDS_NAME = "seeds.json"
COLLOCATIONS_NAME = "collocations.parquet"  # COLLOCATION_SCHEMA, with `--peer-signals`
INFORMATIVENESS_NAME = "informativeness.parquet"  # INFORMATIVENESS_SCHEMA, with `--peer-signals`


class ManifestError(ValueError):
    """A manifest that is missing, malformed, of an unknown schema version, or unsafe."""


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}.parquet"


def word_table_shard_name(index: int, count: int) -> str:
    return f"{WORD_TABLE_NAME}/words-{index:05d}-of-{count:05d}.parquet"


def read_word_table(version_url: str, word_table: str, columns: list[str] | None = None,
                    filter: Any = None) -> Any:
    """A version's word table (`manifest.word_table`) as one pyarrow Table (its shards, or the one file of format 1), in
    word_index order; `columns` and a `pyarrow.dataset` `filter` read only what is asked."""
    # heavy: this pyarrow module loads only when data is read: importing this module stays light
    import pyarrow.dataset as ds

    fs, path = fsspec.core.url_to_fs(posixpath.join(version_url.rstrip("/"), word_table))
    table = ds.dataset(path, filesystem=fs, format="parquet").to_table(columns=columns, filter=filter)
    return table.sort_by("word_index") if "word_index" in table.column_names else table


def safe_relative_path(path: str) -> str:
    """Returns `path` if it is a plain relative path inside the version folder, else raises."""
    if not path or "://" in path or path.startswith(("/", "\\")) or ":" in path.split("/", 1)[0]:
        raise ManifestError(f"shard path {path!r} is not relative to the dataset version")
    normalized = posixpath.normpath(path)
    if normalized.startswith("..") or "\\" in path:
        raise ManifestError(f"shard path {path!r} leaves the dataset version")
    return normalized


def vocab_hash(vocab: dict[str, int]) -> str:
    """The manifest's `tokenizer.vocab_hash`: sha256 of the (token, id) pairs, sorted. Readers
    compare it with their tokenizer's before training on a dataset."""
    return hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode("utf-8")).hexdigest()


def sha256_stream(stream: IO[bytes], chunk_size: int = 1 << 20) -> tuple[str, int]:
    """(hex sha256, bytes) of what a binary stream holds, read in chunks: the one way a file is hashed."""
    digest, size = hashlib.sha256(), 0
    while chunk := stream.read(chunk_size):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def sha256_file(url: str) -> str:
    """Hex sha256 of a local or remote file, streamed (transient errors retried: maskstream.storage.retry)."""

    def read() -> str:
        with fsspec.open(url, "rb") as f:
            return sha256_stream(f)[0]

    return retry_read(read, url)


@dataclasses.dataclass(frozen=True)
class ShardEntry:
    path: str  # relative to the version folder
    rows: int
    bytes: int
    sha256: str
    tokens: int = 0


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What `manifest.json` holds. `tokenizer` carries what the trainer needs without loading it:
    name, vocab_hash, vocab_size, pad/mask/cls/sep/unk token ids and all_special_ids.

    version: the version folder's name. created_at: when the build finished (UTC, ISO 8601).
    encoder: the model that embedded the words, its pooling and dtype. seeds: the seed words.
    formulas: the name and version of each formula used (word rule, TF-ICF, mask probability).
    config: the BuildConfig and inputs the version was built with. source_fingerprint: the input
    files (paths, sizes, sha256) and the documents read, accepted and rejected. shards: each shard's
    path, rows, bytes, sha256 and tokens. word_table / word_table_format: where the word table is and
    its layout. schema_version: the manifest format. diagnostics, vocabulary and peer_signals: below.
    """

    version: str
    created_at: str
    tokenizer: dict[str, Any]
    encoder: dict[str, Any]
    seeds: list[str]
    formulas: dict[str, str]
    config: dict[str, Any]
    source_fingerprint: dict[str, Any]
    shards: list[ShardEntry]
    word_table: str = LEGACY_WORD_TABLE_NAME  # what a manifest without the field meant
    word_table_format: int = 1  # 1: one file; 2: a folder of shards (WORD_TABLE_SHARD_ROWS types each)
    schema_version: int = SCHEMA_VERSION
    # Signal diagnostics of the mask probabilities (pipelines/dataset/core/signal_tallies.py: lifts, entropy ratio,
    # most and least masked words, histogram, near-uniform warning, and `budget_shortfall`: sequences
    # more than 1 % below their masking budget and the expected masks they miss, absent before
    # issue 31); {} in older versions.
    diagnostics: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The vocabulary policy (pipelines/dataset/core/vocabulary.py): min_word_count, fallback and
    # fallback_similarity, word_types (_encoded, _skipped), word_occurrences (_encoded, _coverage),
    # tokens_in_words, tokens_encoded, token_coverage; {} in older versions (every word encoded).
    vocabulary: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The peers' signals (`maskstream build --peer-signals`): their settings, formulas, files and
    # sizes; {} when the version has none, and then absent from manifest.json.
    peer_signals: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def total_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        if not data["peer_signals"]:
            del data["peer_signals"]  # a version without them reads as before they existed
        data["totals"] = {"rows": self.total_rows, "tokens": self.total_tokens, "bytes": self.total_bytes}
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(f"manifest is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ManifestError("manifest is not a JSON object")
        version = data.get("schema_version")
        if version not in SUPPORTED_SCHEMA_VERSIONS:
            raise ManifestError(
                f"unknown dataset schema version {version!r}; this maskstream reads {SUPPORTED_SCHEMA_VERSIONS}"
            )
        data.pop("totals", None)
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING and f.name not in data)
        if missing:
            raise ManifestError(f"manifest lacks {missing}")
        try:
            shards = [ShardEntry(**s) for s in data["shards"]]
        except TypeError as e:
            raise ManifestError(f"malformed shard entry: {e}") from e
        for shard in shards:
            safe_relative_path(shard.path)
        safe_relative_path(data.get("word_table", LEGACY_WORD_TABLE_NAME))
        return cls(**{k: v for k, v in data.items() if k in fields and k != "shards"}, shards=shards)


def resolve_version(dataset: str) -> str:
    """The URL of a complete dataset version: `dataset` itself if it holds a manifest, else the
    version `dataset/latest` names."""
    dataset = dataset.rstrip("/")
    fs, path = fsspec.core.url_to_fs(dataset)
    if retry_read(lambda: fs.exists(posixpath.join(path, MANIFEST_NAME)), dataset):
        return dataset
    pointer = posixpath.join(path, LATEST_POINTER)
    if not retry_read(lambda: fs.exists(pointer), dataset):
        raise ManifestError(f"{dataset} holds neither {MANIFEST_NAME} nor a {LATEST_POINTER!r} pointer")
    version = retry_read(lambda: fs.cat_file(pointer), f"{dataset}/{LATEST_POINTER}").decode("utf-8").strip()
    safe_relative_path(version)
    return f"{dataset}/{version}"


def load_manifest(dataset: str) -> tuple[str, Manifest]:
    """(version URL, manifest) of `dataset` (a root or a version folder)."""
    version_url = resolve_version(dataset)
    url = f"{version_url}/{MANIFEST_NAME}"

    def read() -> str:
        with fsspec.open(url, "r", encoding="utf-8") as f:
            return f.read()

    return version_url, Manifest.from_json(retry_read(read, url))

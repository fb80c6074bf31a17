"""Writing a dataset version: shards, word table, seeds, manifest, `latest`, via fsspec.

Local paths and `gs://` (gcsfs) alike. Atomicity: a version is written into its own fresh
folder; `manifest.json` is written last (local: to a temporary name, then renamed; GCS: one
object upload, which is atomic), and only then is `ROOT/latest` replaced the same way. A build
that fails or is killed before that leaves `latest` and every earlier version as they were; the
half-written folder has no manifest, so readers refuse it.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import uuid
from collections.abc import Iterable, Sequence

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from maskstream.mask_signal.probability import mask_probabilities_flat
from maskstream.pipelines.dataset.core.sequences import flat, list_column
from maskstream.schemas.manifest import (
    LATEST_POINTER,
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    sha256_file,
    shard_name,
)
from maskstream.schemas.tables import SEQUENCE_SCHEMA, WORD_TABLE_SCHEMA
from maskstream.storage.publish import write_atomically


def new_version_name() -> str:
    """A fresh, sortable version name: UTC time plus a short random suffix."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def prepare_version(root: str, version: str) -> str:
    """Creates `ROOT/VERSION/` and returns its URL; refuses a version folder that already exists."""
    url = join(root, version)
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path) and (fs.isfile(path) or fs.ls(path)):
        raise FileExistsError(f"dataset version {url} already exists; versions are never overwritten")
    fs.makedirs(path, exist_ok=True)
    return url


def dataset_rows(windows: pa.Table, sequence_ids: np.ndarray, similarity: np.ndarray, **probability) -> pa.Table:
    """Windows (`maskstream.pipelines.dataset.core.sequences.WINDOWS_SCHEMA`) and their ids -> rows of SEQUENCE_SCHEMA,
    with mask probabilities (`mask_probabilities_flat`, keyword options passed through)."""

    word_ids, offsets = flat(windows, "word_ids")
    word_index, _ = flat(windows, "word_index")
    special, _ = flat(windows, "special_tokens_mask")
    p = mask_probabilities_flat(word_ids, word_index, special, offsets, similarity, **probability)
    return pa.table({
        "sequence_id": pa.array(np.asarray(sequence_ids, np.int64), pa.int64()),
        "document_id": windows.column("document_id"),
        "input_ids": windows.column("input_ids"),
        "word_ids": windows.column("word_ids"),
        "word_index": windows.column("word_index"),
        "special_tokens_mask": windows.column("special_tokens_mask"),
        "mask_probability": list_column(p, offsets, pa.float32()),
    }).cast(SEQUENCE_SCHEMA)


def embeddings_table(embeddings: dict[str, np.ndarray]) -> pa.Table:
    """(word, float32 embedding) rows sorted by word: the version's embeddings/ and the embedding cache."""
    words = sorted(embeddings)
    dim = len(next(iter(embeddings.values()))) if embeddings else 0
    matrix = np.stack([embeddings[w] for w in words]).astype(np.float32) if words else np.zeros((0, dim), np.float32)
    return pa.table({
        "word": pa.array(words, pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1), pa.float32()), dim),
    })


def write_parquet(table: pa.Table, url: str, row_group_rows: int) -> tuple[int, str]:
    """Writes `table` to `url`; returns (bytes, sha256) of what was written."""
    buffer = io.BytesIO()
    # Dictionary pages only for text: on token ids and probabilities they cost time and bytes
    # (docs/building.md, "Cost").
    strings = [field.name for field in table.schema if pa.types.is_string(field.type)]
    # One chunk per column: Parquet's page boundaries follow the chunks, so the same rows cut
    # differently would otherwise give other bytes (and other checksums).
    pq.write_table(table.combine_chunks(), buffer, row_group_size=max(1, row_group_rows), compression="zstd", use_dictionary=strings)
    data = buffer.getvalue()
    with fsspec.open(url, "wb") as f:
        f.write(data)
    return len(data), hashlib.sha256(data).hexdigest()


def write_shard(version_url: str, index: int, count: int, parts: Iterable[pa.Table], row_group_rows: int) -> ShardEntry:
    """Writes shard `index` of `count` from parts of SEQUENCE_SCHEMA rows, in sequence-id order."""
    parts = sorted(parts, key=lambda part: part.column("sequence_id")[0].as_py() if part.num_rows else -1)
    table = pa.concat_tables(parts) if parts else SEQUENCE_SCHEMA.empty_table()
    ids = table.column("sequence_id").to_numpy()
    if np.any(ids[1:] < ids[:-1]):  # parts are usually sorted runs: then no gather of every token
        table = table.sort_by("sequence_id")
    name = shard_name(index, count)
    size, digest = write_parquet(table, join(version_url, name), row_group_rows)
    tokens = int(pc.sum(pc.list_value_length(table.column("input_ids"))).as_py() or 0)
    return ShardEntry(path=name, rows=table.num_rows, bytes=size, sha256=digest, tokens=tokens)


def word_table(words: Sequence[str], word_index: np.ndarray, similarity: np.ndarray,
               nearest_seed: Sequence[str]) -> pa.Table:
    """Rows of the word table (WORD_TABLE_SCHEMA)."""
    return pa.table({
        "word": pa.array(words, pa.string()),
        "word_index": pa.array(np.asarray(word_index, np.int32)),
        "similarity": pa.array(np.asarray(similarity, np.float32)),
        "nearest_seed": pa.array(nearest_seed, pa.string()),
    }, schema=WORD_TABLE_SCHEMA)


def write_word_table(version_url: str, name: str, table: pa.Table) -> int:
    """Writes the word table in `word_index` order; returns its rows."""
    table = table.sort_by("word_index")
    write_parquet(table, join(version_url, name), 100_000)
    return table.num_rows


def write_manifest_and_latest(root: str, manifest: Manifest) -> str:
    """Writes the manifest (last, atomically) and then moves `ROOT/latest` to this version."""
    version_url = join(root, manifest.version)
    write_atomically(join(version_url, MANIFEST_NAME), manifest.to_json().encode("utf-8"))
    write_atomically(join(root, LATEST_POINTER), (manifest.version + "\n").encode("utf-8"))
    return version_url


def verify_shard(version_url: str, entry: ShardEntry) -> str | None:
    """None if the shard's sha256 matches the manifest, else a reason naming the shard."""
    try:
        digest = sha256_file(join(version_url, entry.path))
    except FileNotFoundError:
        return f"{entry.path}: missing"
    if digest != entry.sha256:
        return f"{entry.path}: sha256 {digest} does not match the manifest's {entry.sha256}"
    return None

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
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from schemas.manifest import LATEST_POINTER, MANIFEST_NAME, Manifest, ShardEntry, sha256_file, shard_name
from schemas.tables import SEQUENCE_SCHEMA, WORD_TABLE_SCHEMA

LIST_COLUMNS = ("input_ids", "word_ids", "word_index", "special_tokens_mask", "mask_probability")


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


def write_atomically(url: str, data: bytes) -> None:
    """Readers see either the old object or the whole new one."""
    fs, path = fsspec.core.url_to_fs(url)
    if isinstance(fs, LocalFileSystem):
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fs.mv(tmp, path)
    else:  # object stores: a single-object upload becomes visible all at once
        with fs.open(path, "wb") as f:
            f.write(data)


def sequences_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows (dicts with numpy list columns) -> a table of SEQUENCE_SCHEMA, built from flat arrays."""
    lengths = np.fromiter((len(r["input_ids"]) for r in rows), np.int64, len(rows))
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    columns = {
        "sequence_id": pa.array([r["sequence_id"] for r in rows], pa.int64()),
        "document_id": pa.array([r["document_id"] for r in rows], pa.string()),
    }
    for name in LIST_COLUMNS:
        value_type = SEQUENCE_SCHEMA.field(name).type.value_type
        values = np.concatenate([np.asarray(r[name]) for r in rows]) if rows else np.zeros(0)
        columns[name] = pa.ListArray.from_arrays(offsets, pa.array(values, type=value_type))
    return pa.table(columns).cast(SEQUENCE_SCHEMA)


def write_parquet(table: pa.Table, url: str, row_group_rows: int) -> tuple[int, str]:
    """Writes `table` to `url`; returns (bytes, sha256) of what was written."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=max(1, row_group_rows), compression="zstd")
    data = buffer.getvalue()
    with fsspec.open(url, "wb") as f:
        f.write(data)
    return len(data), hashlib.sha256(data).hexdigest()


def write_shard(version_url: str, index: int, count: int, rows: Iterable[dict[str, Any]], row_group_rows: int) -> ShardEntry:
    rows = sorted(rows, key=lambda r: r["sequence_id"])
    table = sequences_table(rows)
    name = shard_name(index, count)
    size, digest = write_parquet(table, join(version_url, name), row_group_rows)
    tokens = int(sum(len(r["input_ids"]) for r in rows))
    return ShardEntry(path=name, rows=len(rows), bytes=size, sha256=digest, tokens=tokens)


def write_word_table(version_url: str, name: str, rows: Iterable[dict[str, Any]]) -> int:
    rows = sorted(rows, key=lambda r: r["word_index"])
    table = pa.Table.from_pylist(rows, schema=WORD_TABLE_SCHEMA)
    write_parquet(table, join(version_url, name), 100_000)
    return len(rows)


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

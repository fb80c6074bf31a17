"""A bounded local cache of a remote dataset's shards: each shard is read from the bucket once, then
from local disk, for as long as the cache has room.

- **Where and how much**: `ShardCache(folder, limit_bytes)`. A shard is stored under its sha256 (the
  manifest's), so two versions that share a shard share its file, and a file is only ever the bytes
  the manifest names: each download is hashed while it is written and kept only if it matches
  (else `ChecksumMismatch`, naming the shard).
- **Least recently used goes first**: before a shard is added, the files read longest ago (their
  modification time, touched on every use) are removed until the new one fits. The files in the
  folder never add up to more than the limit; a shard larger than the limit is read from the bucket.
- **Read ahead**: `read_ahead(urls)` downloads the next shards on a background thread while the
  current ones are trained on (MosaicML's `predownload`).
- **Processes**: loader workers and ranks on one machine may share a folder; a file lock per folder
  serializes additions and evictions, and a download goes to a temporary name first, so a reader
  sees a whole shard or none.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import fsspec

from maskstream.schemas.manifest import ManifestError

LOG = logging.getLogger("maskstream.train")

CHUNK_BYTES = 1 << 22  # bytes copied and hashed at a time
SUFFIX = ".parquet"


class ChecksumMismatch(ManifestError):
    """A shard whose bytes do not hash to the sha256 its manifest records."""


class ShardCache:
    """Shards by sha256 in `folder`, at most `limit_bytes` of them (see module doc)."""

    def __init__(self, folder: str | os.PathLike, limit_bytes: int, read_ahead_shards: int = 2) -> None:
        if limit_bytes < 1:
            raise ValueError(f"the cache limit must be at least 1 byte, got {limit_bytes}")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.limit_bytes = limit_bytes
        self.read_ahead_shards = read_ahead_shards
        self.bytes_downloaded = 0  # by this process: what the bucket served
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # a copy in each loader worker: no thread, no futures
        state = self.__dict__.copy()
        state.update(_pool=None, _pending={}, _lock=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def path_of(self, sha256: str) -> Path:
        return self.folder / f"{sha256}{SUFFIX}"

    def cached_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob(f"*{SUFFIX}"))

    @contextlib.contextmanager
    def _folder_lock(self) -> Iterator[None]:
        with open(self.folder / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def local(self, url: str, sha256: str, size: int, name: str) -> str | None:
        """A local path holding `url`'s bytes (downloaded and checked now if needed), or None when the
        shard is larger than the whole cache (read it from `url`)."""
        if size > self.limit_bytes:
            return None
        pending = self._pending.get(sha256)
        if pending is not None:
            pending.result()  # the read-ahead is fetching it: wait for it rather than fetch twice
        path = self.path_of(sha256)
        with self._folder_lock():
            if path.exists():
                os.utime(path)  # most recently used
                return str(path)
            self._make_room(size)
            self._download(url, sha256, path, name)
        return str(path)

    def _make_room(self, size: int) -> None:
        files = sorted(self.folder.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        while files and total + size > self.limit_bytes:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink(missing_ok=True)  # a reader that has it open keeps reading it
            LOG.debug("shard cache: evicted %s", oldest.name)

    def _download(self, url: str, sha256: str, path: Path, name: str) -> None:
        digest = hashlib.sha256()
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        try:
            with fsspec.open(url, "rb") as source, open(partial, "wb") as target:
                while chunk := source.read(CHUNK_BYTES):
                    digest.update(chunk)
                    target.write(chunk)
            if digest.hexdigest() != sha256:
                raise ChecksumMismatch(f"shard {name} ({url}): sha256 {digest.hexdigest()} does not match the "
                                       f"manifest's {sha256}")
            self.bytes_downloaded += partial.stat().st_size
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)

    def read_ahead(self, shards: Iterable[tuple[str, str, int, str]]) -> None:
        """Starts fetching the next `read_ahead_shards` of `shards` ((url, sha256, size, name), in the
        order they will be read) on a background thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="shard-read-ahead")
        with self._lock:
            for url, sha256, size, name in list(shards)[: self.read_ahead_shards]:
                if sha256 not in self._pending and not self.path_of(sha256).exists() and size <= self.limit_bytes:
                    self._pending[sha256] = self._pool.submit(self._fetch_quietly, url, sha256, size, name)

    def _fetch_quietly(self, url: str, sha256: str, size: int, name: str) -> None:
        started = time.perf_counter()
        try:
            path = self.path_of(sha256)
            with self._folder_lock():
                if not path.exists():
                    self._make_room(size)
                    self._download(url, sha256, path, name)
            LOG.debug("shard cache: read ahead %s in %.1f s", name, time.perf_counter() - started)
        finally:
            with self._lock:
                self._pending.pop(sha256, None)

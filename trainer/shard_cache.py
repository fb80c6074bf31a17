"""A bounded local cache of a remote dataset's shards: each shard is read from the bucket once, then
from local disk, for as long as the cache has room.

- **Where and how much**: `ShardCache(folder, limit_bytes)`. A shard is stored under its sha256 (the
  manifest's), so two versions that share a shard share its file, and a file is only ever the bytes
  the manifest names: each download is hashed while it is written and kept only if it matches
  (else `ChecksumMismatch`, naming the shard).
- **Least recently used goes first**: before a shard is added, the files read longest ago (their
  modification time, touched on every use) are removed until the new one fits. The files in the
  folder never add up to more than the limit; a shard larger than the limit is read from the bucket.
- **Read ahead**: `read_ahead(shards)` downloads the next two shards on a background thread while
  the current ones are trained on (MosaicML's `predownload`), into free room only: it never evicts.
- **Processes**: loader workers and ranks on one machine may share a folder; a file lock per folder
  orders downloads, additions and evictions, a download goes to `.partial/` first, so a reader sees
  a whole shard or none, and a shard is opened under the lock, so an eviction cannot take it away
  from a reader. Downloads in progress count toward the limit.
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
from typing import BinaryIO

import fsspec

from maskstream.schemas.manifest import ManifestError
from maskstream.storage.publish import open_atomically

LOG = logging.getLogger("maskstream.train")

CHUNK_BYTES = 1 << 22  # bytes copied and hashed at a time
SUFFIX = ".parquet"
PARTIAL_DIR = ".partial"  # downloads in progress
LOCK_NAME = ".lock"
STALE_PARTIAL_S = 3600  # a partial file this old was left by a killed process


class ChecksumMismatch(ManifestError):
    """A shard whose bytes do not hash to the sha256 its manifest records."""


class ShardCache:
    """Shards by sha256 in `folder`, at most `limit_bytes` of them (see module doc)."""

    def __init__(self, folder: str | os.PathLike, limit_bytes: int, read_ahead_shards: int = 2) -> None:
        if limit_bytes < 1:
            raise ValueError(f"the cache limit must be at least 1 byte, got {limit_bytes}")
        self.folder = Path(folder)
        (self.folder / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)
        self.limit_bytes = limit_bytes
        self.read_ahead_shards = read_ahead_shards
        self.bytes_downloaded = 0  # by this process: what the bucket served
        self._reset_threads()

    def _reset_threads(self) -> None:
        """No read-ahead thread yet, in this process (a forked or unpickled loader worker starts its own)."""
        self._pid = os.getpid()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_pool", "_pending", "_lock"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_threads()

    def _threads(self) -> None:
        if self._pid != os.getpid():  # a forked worker inherited the parent's pool, not its thread
            self._reset_threads()

    def path_of(self, sha256: str) -> Path:
        return self.folder / f"{sha256}{SUFFIX}"

    def cached_bytes(self) -> int:
        """Bytes on disk: complete shards and downloads in progress."""
        return sum(p.stat().st_size for p in self._files(self.folder) + self._files(self.folder / PARTIAL_DIR))

    @staticmethod
    def _files(folder: Path) -> list[Path]:
        return [p for p in folder.iterdir() if p.is_file() and p.name != LOCK_NAME]

    @contextlib.contextmanager
    def _folder_lock(self) -> Iterator[None]:
        with open(self.folder / LOCK_NAME, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def open(self, url: str, sha256: str, size: int, name: str) -> BinaryIO | None:
        """`url`'s bytes as an open local file (downloaded and checked now if needed), or None when
        the shard is larger than the whole cache (read it from `url`). Opened under the folder's lock:
        an eviction after that cannot take it away (the open file outlives its name)."""
        if size > self.limit_bytes:
            return None
        self._threads()
        pending = self._pending.get(sha256)
        if pending is not None:
            pending.result()  # the read-ahead is fetching it: wait for it rather than fetch twice
        path = self.path_of(sha256)
        with self._folder_lock():
            if not path.exists():
                self._make_room(size)
                self._download(url, sha256, path, name)
            os.utime(path)  # most recently used
            return open(path, "rb")

    def _make_room(self, size: int) -> None:
        """Removes the least recently used shards until `size` more bytes fit (under the folder's
        lock). Downloads in progress count; one left by a killed process (an hour old) is removed."""
        partial = self._files(self.folder / PARTIAL_DIR)
        for stale in [p for p in partial if time.time() - p.stat().st_mtime > STALE_PARTIAL_S]:
            stale.unlink(missing_ok=True)
            partial.remove(stale)
        files = sorted((p for p in self._files(self.folder) if p.suffix == SUFFIX), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files + partial)
        while files and total + size > self.limit_bytes:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink(missing_ok=True)  # a reader that has it open keeps reading it
            LOG.debug("shard cache: evicted %s", oldest.name)

    def _room_without_evicting(self, size: int) -> bool:
        return self.cached_bytes() + size <= self.limit_bytes

    def _download(self, url: str, sha256: str, path: Path, name: str) -> None:
        """`url` -> `path`, through a partial file, kept only if its sha256 is the manifest's."""
        digest = hashlib.sha256()
        partial = self.folder / PARTIAL_DIR / f"{path.name}.{uuid.uuid4().hex}"
        # Written in the partial folder (counted against the limit while it grows), published only if whole.
        with fsspec.open(url, "rb") as source, open_atomically(str(path), aside=str(partial)) as target:
            while chunk := source.read(CHUNK_BYTES):
                digest.update(chunk)
                target.write(chunk)
            if digest.hexdigest() != sha256:
                raise ChecksumMismatch(f"shard {name} ({url}): sha256 {digest.hexdigest()} does not match the "
                                       f"manifest's {sha256}")
            self.bytes_downloaded += target.tell()

    def read_ahead(self, shards: Iterable[tuple[str, str, int, str]]) -> None:
        """Starts fetching the first `read_ahead_shards` of `shards` ((url, sha256, size, name), in the
        order they will be read) on a background thread, into free room only: reading ahead never
        evicts a shard."""
        self._threads()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="shard-read-ahead")
        with self._lock:
            for url, sha256, size, name in list(shards)[: self.read_ahead_shards]:
                if sha256 not in self._pending and not self.path_of(sha256).exists() and size <= self.limit_bytes:
                    self._pending[sha256] = self._pool.submit(self._fetch_ahead, url, sha256, size, name)

    def _fetch_ahead(self, url: str, sha256: str, size: int, name: str) -> None:
        started = time.perf_counter()
        try:
            path = self.path_of(sha256)
            with self._folder_lock():
                if path.exists() or not self._room_without_evicting(size):
                    return
                self._download(url, sha256, path, name)
            LOG.debug("shard cache: read ahead %s in %.1f s", name, time.perf_counter() - started)
        finally:
            with self._lock:
                self._pending.pop(sha256, None)

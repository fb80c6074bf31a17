"""Holding a reader lease (`schemas/lease.py`) on the dataset version being read, so that
`maskstream gc` does not remove it mid-epoch.

`VersionLease(version_url)` writes ROOT/_leases/READER.json for the version and rewrites it from a
daemon thread every `ttl_s / 4` seconds; `move_to(version_url)` follows a switch to a newer
version; `release()` deletes the lease. Writing is best effort: a reader without write access to
the root logs that once and goes on, protected by gc's grace period alone.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import socket
import threading
import uuid

import fsspec

from schemas.lease import ReaderLease, format_time, lease_path, utc_now

LOG = logging.getLogger("maskstream.lease")
LEASE_TTL_S = 300.0  # a killed reader's lease protects its version this long


def split_version_url(version_url: str) -> tuple[str, str]:
    """(dataset root, version name) of ROOT/VERSION."""
    root, _, version = version_url.rstrip("/").rpartition("/")
    return root, version


class VersionLease:
    """A lease on one version at a time, refreshed in the background until `release()`."""

    def __init__(self, version_url: str, ttl_s: float = LEASE_TTL_S):
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
        self.reader = f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._warned = False
        self._root, self._version = split_version_url(version_url)
        self._write()
        self._thread = threading.Thread(target=self._refresh_until_released, name="maskstream-lease", daemon=True)
        self._thread.start()

    @property
    def path(self) -> str:
        return lease_path(self._root, self.reader)

    def _write(self) -> None:
        now = utc_now()
        lease = ReaderLease(self._version, self.reader, format_time(now),
                            format_time(now + datetime.timedelta(seconds=self.ttl_s)))
        try:
            fs, path = fsspec.core.url_to_fs(self.path)
            fs.makedirs(path.rpartition("/")[0], exist_ok=True)
            # Written aside, then moved over the lease: gc never reads half a file.
            with fs.open(f"{path}.tmp", "w", encoding="utf-8") as f:
                f.write(lease.to_json())
            fs.mv(f"{path}.tmp", path)
        except OSError as e:
            if not self._warned:
                LOG.warning("cannot write a reader lease at %s (%s): only gc's --grace-minutes protects version %s "
                            "while this run reads it", self.path, e, self._version)
                self._warned = True

    def _refresh_until_released(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            with self._lock:
                self._write()

    def move_to(self, version_url: str) -> None:
        """Leases `version_url` instead (one file per reader: rewriting it is the move)."""
        with self._lock:
            self._root, self._version = split_version_url(version_url)
            self._write()

    def release(self) -> None:
        """Stops refreshing and deletes the lease."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            try:
                fs, path = fsspec.core.url_to_fs(self.path)
                fs.rm_file(path)
            except OSError:
                pass  # never written (no write access), or already gone: it expires either way

"""Reader leases: how a process reading a dataset version tells `maskstream gc` to spare it.

A reader (`maskstream train` and `update`, through `VersionLease` below) writes one small JSON file per process
under the dataset root and rewrites it while it reads:

    ROOT/_leases/READER.json   {"schema": "maskstream-reader-lease-v1", "version": "v10",
                                "reader": "host-4242-1f2e3d4c", "refreshed_at": "...Z",
                                "expires_at": "...Z"}

`version` is the version folder's name under ROOT; the times are ISO 8601 UTC. `gc` keeps every
version named by a lease whose `expires_at` is in the future, and removes leases that expired
longer ago than its --grace-minutes. A reader refreshes its lease well before it expires, moves it
when it switches versions (the new version's lease is written before the old one goes) and
deletes it when it stops; a reader that is killed leaves a lease that simply expires. A reader
without write access to the root cannot hold a lease: gc's grace period (versions that were
`latest` within --grace-minutes are kept) is then what protects it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import posixpath
import re
import socket
import threading
import uuid
from typing import Any

import fsspec

from maskstream.storage.publish import write_atomically

LOG = logging.getLogger("maskstream.lease")
LEASES_DIR = "_leases"
LEASE_SCHEMA = "maskstream-reader-lease-v1"
LEASE_TTL_S = 300.0  # a killed process's lease protects its version this long


class LeaseError(ValueError):
    """A lease file that is not a lease of this schema."""


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def format_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime.datetime:
    """An ISO 8601 time as an aware UTC datetime (a naive one is read as UTC)."""
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


@dataclasses.dataclass(frozen=True)
class ReaderLease:
    version: str  # the version folder's name under the dataset root
    reader: str  # unique per reading process; also the file's name
    refreshed_at: str
    expires_at: str
    schema: str = LEASE_SCHEMA

    def live(self, now: datetime.datetime) -> bool:
        return parse_time(self.expires_at) > now

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ReaderLease:
        try:
            data: Any = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise LeaseError(f"not JSON: {e}") from e
        if not isinstance(data, dict) or data.get("schema") != LEASE_SCHEMA:
            raise LeaseError(f"not a {LEASE_SCHEMA} lease")
        try:
            lease = cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})
            parse_time(lease.expires_at)
            parse_time(lease.refreshed_at)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise LeaseError(f"malformed lease: {e!r}") from e
        return lease


def lease_path(root: str, reader: str) -> str:
    """ROOT/_leases/READER.json (a path or URL, as `root` is)."""
    return posixpath.join(root.rstrip("/"), LEASES_DIR, f"{reader}.json")


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
            write_atomically(self.path, lease.to_json().encode("utf-8"))  # gc never reads half a lease
        except Exception as e:  # best effort, whatever the storage raises: a lease never fails its holder
            if not self._warned:
                LOG.warning("cannot write a lease at %s (%s): only gc's --grace-minutes protects version %s while "
                            "this process uses it", self.path, e, self._version)
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
            except Exception:  # noqa: BLE001
                pass  # never written (no write access), or already gone: it expires either way

"""Reads from object stores retried with exponential backoff, then reported with their path.

gcsfs already retries each HTTP request (408, 429, 5xx, dropped connections: up to 6 tries,
backoff 1, 2, 4, ... s). `retry_read` sits one level up, around a whole read (open + read a
manifest, a footer, a row group, a checksum pass), so it also covers what surfaces from a
half-read file, from pyarrow, or from filesystems without their own retries (HTTP, NFS
mounts), and it ends with one error naming the path. Errors that another try cannot fix
(a missing file, no permission, a corrupt Parquet file, a checksum mismatch) are raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa

LOG = logging.getLogger(__name__)
T = TypeVar("T")

READ_ATTEMPTS = 5
BASE_DELAY_S = 0.5  # then 1, 2, 4 s: 7.5 s of waiting before the error
MAX_DELAY_S = 8.0
RETRIABLE_HTTP_STATUS = frozenset({408, 429, 500, 502, 503, 504})
PERMANENT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)


class ReadError(OSError):
    """A read that still failed after every retry (or at once, for a permanent error)."""


def is_transient(error: BaseException) -> bool:
    """Whether trying the same read again may succeed."""
    if isinstance(error, (ReadError, pa.ArrowException, *PERMANENT_OS_ERRORS)):
        return False  # already retried below; corrupt data; a missing file or no permission
    status = getattr(error, "code", None) or getattr(error, "status", None)
    if isinstance(status, int):
        return status in RETRIABLE_HTTP_STATUS
    return isinstance(error, OSError)  # ConnectionError and TimeoutError included


def retry_read(
    read: Callable[[], T],
    what: str,
    *,
    attempts: int | None = None,
    on_retry: Callable[[], None] | None = None,
) -> T:
    """`read()`, tried up to `attempts` times (default READ_ATTEMPTS) while it fails transiently,
    waiting BASE_DELAY_S, 2x, 4x, ... (at most MAX_DELAY_S) in between. `on_retry` runs before
    each new try (e.g. to drop a half-read file handle). `what` names the path in logs and errors."""
    attempts = READ_ATTEMPTS if attempts is None else attempts
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    attempt = 0
    while True:
        attempt += 1
        try:
            return read()
        except Exception as error:
            if not is_transient(error):
                raise
            if attempt == attempts:
                raise ReadError(
                    f"reading {what} failed {attempts} times, giving up: {type(error).__name__}: {error}"
                ) from error
            delay = min(BASE_DELAY_S * 2 ** (attempt - 1), MAX_DELAY_S)
            LOG.warning("reading %s failed (%s: %s); try %d of %d in %.1f s",
                        what, type(error).__name__, error, attempt + 1, attempts, delay)
            time.sleep(delay)
            if on_retry is not None:
                on_retry()

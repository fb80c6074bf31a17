"""Check, before a command starts, that every remote path it names can be reached.

Without this, a `gs://` path with no network or no credentials surfaces deep inside Beam or
gcsfs as credential warnings and minutes of retries. Here each bucket the arguments name is
listed once, in a thread, under a deadline: a missing bucket, refused credentials, a refused
connection or silence all end in one line that names the path, the cause and what to do.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

DEFAULT_TIMEOUT_S = 20.0
TIMEOUT_ENV = "MASKSTREAM_REMOTE_TIMEOUT"  # overrides the default, e.g. in a container
LOCAL_PROTOCOLS = frozenset({"", "file", "local"})


class RemotePathError(Exception):
    """A remote path that cannot be used; the message is the whole explanation."""


def remote_urls(values: Iterable[Any]) -> list[str]:
    """The `scheme://` paths among a parsed command's argument values (strings and lists of strings)."""
    urls: list[str] = []
    for value in values:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str) and item.startswith("--") and "=" in item:
                item = item.split("=", 1)[1]  # a flag passed on to Beam, e.g. --temp_location=gs://...
            if isinstance(item, str) and "://" in item and item.split("://", 1)[0] not in LOCAL_PROTOCOLS:
                urls.append(item)
    return urls


def _bucket_of(url: str) -> tuple[str, str]:
    protocol, rest = url.split("://", 1)
    return protocol, rest.split("/", 1)[0]


def _advice(protocol: str) -> str:
    if protocol in ("gs", "gcs"):
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            return f"check that the storage emulator at STORAGE_EMULATOR_HOST={emulator} is running"
        return ("check the network, and the credentials: `gcloud auth application-default login` or "
                "GOOGLE_APPLICATION_CREDENTIALS=key.json (or STORAGE_EMULATOR_HOST for an emulator)")
    return f"check the network and the credentials of the {protocol}:// filesystem"


def _list_bucket(protocol: str, bucket: str) -> None:
    # fsspec and its filesystems load only when a path is opened: importing this module stays light
    import fsspec

    # A private instance without a listings cache: the command's own filesystem objects (fsspec
    # shares instances) must not see this listing later as a stale snapshot of the bucket.
    fsspec.filesystem(protocol, skip_instance_cache=True, use_listings_cache=False).ls(bucket, detail=False)


def _explain(error: BaseException, protocol: str, bucket: str) -> str:
    """Cause and remedy of a failed listing, in one clause."""
    status = getattr(error, "code", None) or getattr(error, "status", None)
    text = str(error).splitlines()[0] if str(error) else ""
    if isinstance(error, FileNotFoundError):
        return f"bucket {bucket!r} does not exist; check the name, or create it"
    if isinstance(error, PermissionError) or status in (401, 403):
        return f"access refused ({type(error).__name__}: {text or status}); {_advice(protocol)}"
    return f"cannot reach {protocol}://{bucket} ({type(error).__name__}{': ' + text if text else ''}); {_advice(protocol)}"


def check_reachable(urls: Iterable[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """List each distinct bucket of `urls` within `timeout_s` seconds in all; raise
    RemotePathError naming the first URL whose bucket fails. Threads are daemons: one stuck
    in a retry loop does not keep the process alive after the error."""
    first_url: dict[tuple[str, str], str] = {}
    for url in urls:
        first_url.setdefault(_bucket_of(url), url)
    if not first_url:
        return
    outcomes: dict[tuple[str, str], BaseException | None] = {}

    def probe(key: tuple[str, str]) -> None:
        try:
            _list_bucket(*key)
            outcomes[key] = None
        except BaseException as error:  # noqa: BLE001 - every failure is reported, none re-raised here
            outcomes[key] = error

    threads = {key: threading.Thread(target=probe, args=(key,), daemon=True) for key in first_url}
    for thread in threads.values():
        thread.start()
    deadline = threading.Event()
    timer = threading.Timer(timeout_s, deadline.set)
    timer.daemon = True
    timer.start()
    try:
        for key, thread in threads.items():
            while thread.is_alive() and not deadline.is_set():
                thread.join(0.05)
            url = first_url[key]
            if thread.is_alive():
                raise RemotePathError(f"{url}: no answer from {key[0]}://{key[1]} within {timeout_s:g} s; "
                                      f"{_advice(key[0])} (--remote-timeout sets the wait)")
            error = outcomes.get(key)
            if error is not None:
                raise RemotePathError(f"{url}: {_explain(error, *key)}") from error
    finally:
        timer.cancel()

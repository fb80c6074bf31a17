"""Transient object-store errors are retried with backoff, then reported with the path.

The retry lives in `maskstream/storage/retry.py` (`retry_read`), around each whole read of the trainer's
shard reader and of the manifest helpers: opening and reading a manifest or `latest`, a shard's
footer, a block of rows, a checksum pass. Faults are injected by an fsspec filesystem
(`flaky://`, local files underneath) that fails the first N opens or reads of the shards, and,
end to end, by an HTTP proxy in front of the GCS emulator that answers 503 to the first
requests for the shards (those gcsfs retries itself, below ours).
"""

from __future__ import annotations

import http.client
import http.server
import logging
import socketserver
import threading
from pathlib import Path

import fsspec
import numpy as np
import pytest
from fsspec.implementations.local import LocalFileSystem

import maskstream.storage.retry
from maskstream.schemas.manifest import load_manifest
from maskstream.storage.retry import ReadError, retry_read
from maskstream.trainer.dataset import StreamingSequenceDataset


class FlakyFileSystem(LocalFileSystem):
    """Local files under `flaky://`; the first `open_faults` opens and `read_faults` reads of
    files whose name contains `target` raise ConnectionResetError, as a dropped connection does."""

    protocol = "flaky"
    root_marker = "/"
    open_faults = 0
    read_faults = 0
    target = "shard-"
    injected: list[str] = []

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith("flaky://"):
            path = path[len("flaky://"):]
        return super()._strip_protocol(path)

    def unstrip_protocol(self, name: str) -> str:
        return f"flaky://{name}"

    def _open(self, path, mode="rb", **kwargs):
        cls = type(self)
        if cls.target in path and cls.open_faults > 0:
            cls.open_faults -= 1
            cls.injected.append(f"open {path}")
            raise ConnectionResetError(104, "Connection reset by peer (injected)")
        f = super()._open(path, mode, **kwargs)
        if cls.target in path and "r" in mode:
            original_read = f.read

            def read(*args, **kw):
                if cls.read_faults > 0:
                    cls.read_faults -= 1
                    cls.injected.append(f"read {path}")
                    raise ConnectionResetError(104, "Connection reset by peer (injected)")
                return original_read(*args, **kw)

            f.read = read
        return f


@pytest.fixture()
def flaky(monkeypatch: pytest.MonkeyPatch) -> type[FlakyFileSystem]:
    fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)
    monkeypatch.setattr(FlakyFileSystem, "open_faults", 0)
    monkeypatch.setattr(FlakyFileSystem, "read_faults", 0)
    monkeypatch.setattr(FlakyFileSystem, "injected", [])
    FlakyFileSystem.clear_instance_cache()
    return FlakyFileSystem


@pytest.fixture()
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff waits, recorded instead of slept."""
    waits: list[float] = []
    monkeypatch.setattr(maskstream.storage.retry.time, "sleep", waits.append)
    return waits


def rows(dataset: StreamingSequenceDataset) -> list[tuple[int, list[int]]]:
    return [(s["sample_index"], s["input_ids"].tolist()) for s in dataset]


def test_transient_open_and_read_errors_are_retried_with_backoff(flaky, sleeps, dataset_copy: Path, caplog) -> None:
    expected = rows(StreamingSequenceDataset(str(dataset_copy), shuffle=False))
    caplog.set_level(logging.WARNING, logger="maskstream.storage.retry")
    flaky.open_faults = 2
    dataset = StreamingSequenceDataset(f"flaky://{dataset_copy}", shuffle=False)  # footers: 2 failed opens
    flaky.read_faults = 3  # the checksum pass and the row reads: 3 failed reads
    assert rows(dataset) == expected  # nothing lost, nothing repeated
    assert len(flaky.injected) == 5
    # Each failure waited 0.5 s, then 1 s, ... from the start again for the next read.
    assert sleeps and all(s in (0.5, 1.0, 2.0) for s in sleeps) and len(sleeps) == 5
    assert sleeps[:2] == [0.5, 1.0]
    retried = [r.getMessage() for r in caplog.records if "try" in r.getMessage()]
    assert len(retried) == 5 and all("shard-0000" in m for m in retried)


def test_persistent_errors_are_reported_with_the_path_after_the_retries(flaky, sleeps, dataset_copy: Path) -> None:
    dataset = StreamingSequenceDataset(f"flaky://{dataset_copy}", shuffle=False)
    flaky.read_faults = 1_000  # the store stays down
    with pytest.raises(ReadError, match=r"reading flaky://\S+/v1/shard-00000-of-00002.parquet failed 5 times") as info:
        next(iter(dataset))
    assert isinstance(info.value.__cause__, ConnectionResetError)
    assert sleeps == [0.5, 1.0, 2.0, 4.0]  # exponential backoff, then the error
    assert len(flaky.injected) == 5  # no nested retries (the checksum's own retry is not repeated)


def test_permanent_errors_are_not_retried(sleeps, tmp_path: Path) -> None:
    calls = []

    def missing() -> bytes:
        calls.append(1)
        return Path(tmp_path / "nope").read_bytes()

    with pytest.raises(FileNotFoundError):
        retry_read(missing, "nope")
    assert calls == [1] and sleeps == []


class FailingProxy(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def start_proxy(upstream: str, failures: dict[str, int], status: int = 503) -> FailingProxy:
    """An HTTP proxy to the emulator that answers `status` (503 by default) to the first
    `failures[word]` requests whose path contains `word`."""
    host, port = upstream.removeprefix("http://").split(":")
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _forward(self) -> None:
            with lock:
                word = next((w for w, n in failures.items() if n > 0 and w in self.path), None)
                if word is not None:
                    failures[word] -= 1
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if word is not None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            self.send_response(response.status)
            for k, v in response.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            conn.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

    server = FailingProxy(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.slow
def test_gcs_503s_are_retried_end_to_end(gcs_emulator: str, gcs_bucket: str, fault_rows, monkeypatch) -> None:
    """A dataset in an (emulated) bucket read through a proxy that fails the first shard requests."""
    import gcsfs

    from testing import sequence_dataset as factory

    root = f"{gcs_bucket}/datasets/faults"
    factory.write_dataset(root, fault_rows, shards=2, row_group_size=20)
    expected = [int(s["sample_index"]) for s in StreamingSequenceDataset(root, shuffle=False)]

    failures = {"shard-00001": 3, "manifest.json": 1}
    proxy = start_proxy(gcs_emulator, failures)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{proxy.server_address[1]}")
        gcsfs.GCSFileSystem.clear_instance_cache()
        version_url, manifest = load_manifest(root)
        dataset = StreamingSequenceDataset(root, shuffle=False)
        got = [int(s["sample_index"]) for s in dataset]
    finally:
        proxy.shutdown()
        gcsfs.GCSFileSystem.clear_instance_cache()
    assert failures == {"shard-00001": 0, "manifest.json": 0}  # every injected 503 was met
    assert got == expected == list(np.arange(len(fault_rows)))
    assert manifest.total_rows == len(fault_rows) and version_url.endswith("/v1")


def test_a_version_the_store_cannot_serve_now_is_not_called_gone(flaky, sleeps, dataset_copy: Path,
                                                                monkeypatch) -> None:
    """A resume asks whether the versions it needs still exist: a store that fails every read of the
    manifest raises its error (with the path, after the retries), and only a missing version is gone."""
    from maskstream.trainer.follow import version_exists

    monkeypatch.setattr(flaky, "target", "manifest.json")
    flaky.open_faults = 1_000
    with pytest.raises(ReadError, match=r"reading flaky://\S+/v1/manifest.json failed 5 times"):
        version_exists(f"flaky://{dataset_copy}/v1")
    assert not version_exists(f"flaky://{dataset_copy}/v2")  # never built
    flaky.open_faults = 0
    assert version_exists(f"flaky://{dataset_copy}/v1")

"""`maskstream gc` keeps the right versions and never removes one a reader is using: it orders
versions by their manifest's `created_at`, keeps versions that were `latest` within
--grace-minutes, and keeps versions a reader holds a live lease on (`maskstream/storage/lease.py`), which
`maskstream train` does on the version it streams (`trainer/lease.py`)."""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from maskstream.pipelines.update.gc import collect_garbage
from maskstream.schemas.manifest import LATEST_POINTER, MANIFEST_NAME, Manifest
from maskstream.storage.lease import LEASES_DIR, ReaderLease, VersionLease, format_time, utc_now
from testing import sequence_dataset as factory
from tests.conftest import REPO_ROOT, run_cli


def write_version(root: Path, version: str, created_minutes_ago: float, published_minutes_ago: float | None = None,
                  latest: bool = False) -> None:
    """A complete version (a manifest only: gc reads nothing else), built and published that long ago."""
    created = utc_now() - datetime.timedelta(minutes=created_minutes_ago)
    manifest = Manifest(version=version, created_at=created.isoformat(timespec="seconds"), tokenizer={}, encoder={},
                        seeds=[], formulas={}, config={}, source_fingerprint={}, shards=[])
    (root / version).mkdir(parents=True)
    path = root / version / MANIFEST_NAME
    path.write_text(manifest.to_json())
    published = time.time() - 60 * (created_minutes_ago if published_minutes_ago is None else published_minutes_ago)
    os.utime(path, (published, published))
    if latest:
        (root / LATEST_POINTER).write_text(version + "\n")


def versions_left(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if (p / MANIFEST_NAME).exists()}


def test_versions_are_ordered_by_created_at_not_by_name(tmp_path: Path) -> None:
    # By name v8 > v10 and v9 > v10; by time v10 is the newest. The old gc kept v9 and v8.
    write_version(tmp_path, "v8", created_minutes_ago=300)
    write_version(tmp_path, "v9", created_minutes_ago=200)
    write_version(tmp_path, "v10", created_minutes_ago=100, latest=True)
    write_version(tmp_path, "a-custom-name", created_minutes_ago=400)
    removed = collect_garbage(str(tmp_path), keep=2, grace_minutes=0)
    assert sorted(removed["versions"]) == ["a-custom-name", "v8"]
    assert versions_left(tmp_path) == {"v9", "v10"}
    collect_garbage(str(tmp_path), keep=1, grace_minutes=0)
    assert versions_left(tmp_path) == {"v10"}


def test_a_version_that_was_latest_within_the_grace_period_is_kept(tmp_path: Path) -> None:
    write_version(tmp_path, "v1", created_minutes_ago=120)
    write_version(tmp_path, "v2", created_minutes_ago=90, published_minutes_ago=30)  # v1 was latest until then
    write_version(tmp_path, "v3", created_minutes_ago=5, published_minutes_ago=2, latest=True)  # v2 until then
    removed = collect_garbage(str(tmp_path), keep=1, grace_minutes=10, dry_run=True)
    assert removed["versions"] == ["v1"]
    assert len(removed["kept"]) == 1 and removed["kept"][0].startswith("v2: was latest 2.0 min ago")
    assert versions_left(tmp_path) == {"v1", "v2", "v3"}  # a dry run
    assert collect_garbage(str(tmp_path), keep=1, grace_minutes=60)["versions"] == []
    assert collect_garbage(str(tmp_path), keep=1, grace_minutes=0)["versions"] == ["v1", "v2"]


def write_lease(root: Path, reader: str, version: str, expires_minutes: float) -> None:
    # Times from now, not from the import: a session whose tests run minutes later must not see
    # a 3-minute lease expired.
    now = utc_now()
    expires = now + datetime.timedelta(minutes=expires_minutes)
    (root / LEASES_DIR).mkdir(exist_ok=True)
    lease = ReaderLease(version, reader, format_time(now), format_time(expires))
    (root / LEASES_DIR / f"{reader}.json").write_text(lease.to_json())


def test_a_live_lease_keeps_its_version_and_stale_leases_go(tmp_path: Path, caplog) -> None:
    for index, version in enumerate(["v1", "v2", "v3", "v4"]):
        write_version(tmp_path, version, created_minutes_ago=100 - 10 * index, latest=version == "v4")
    write_lease(tmp_path, "trainer-a", "v1", expires_minutes=3)
    write_lease(tmp_path, "killed-long-ago", "v2", expires_minutes=-120)
    write_lease(tmp_path, "killed-just-now", "v3", expires_minutes=-1)
    (tmp_path / LEASES_DIR / "garbage.json").write_text("{not a lease")
    with caplog.at_level(logging.WARNING):
        removed = collect_garbage(str(tmp_path), keep=1, grace_minutes=30)
    assert removed["kept"] == ["v1: leased by trainer-a"]
    assert sorted(removed["versions"]) == ["v2", "v3"]
    assert removed["leases"] == ["killed-long-ago.json"]  # the other expired one is within the grace
    assert "garbage.json" in caplog.text
    assert versions_left(tmp_path) == {"v1", "v4"}
    assert {p.name for p in (tmp_path / LEASES_DIR).iterdir()} == {"trainer-a.json", "killed-just-now.json",
                                                                   "garbage.json"}


@pytest.mark.slow
def test_the_cli_says_what_it_kept_and_why(tmp_path: Path, subprocess_env) -> None:
    write_version(tmp_path, "v9", created_minutes_ago=200)
    write_version(tmp_path, "v10", created_minutes_ago=100, latest=True)
    write_lease(tmp_path, "host-1-abc", "v9", expires_minutes=5)
    result = run_cli(["gc", str(tmp_path), "--keep", "1", "--grace-minutes", "0"], subprocess_env)
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "kept version v9: leased by host-1-abc"
    assert json.loads(lines[-1]) == {"versions": 0, "incomplete": 0, "files": 0, "embeddings": 0, "leases": 0}


def test_a_reader_without_write_access_warns_once_and_goes_on(tmp_path: Path, caplog) -> None:
    (tmp_path / LEASES_DIR).write_text("a file where the leases folder would be")  # no lease can be written
    with caplog.at_level(logging.WARNING, logger="maskstream.lease"):
        lease = VersionLease(f"{tmp_path}/v1", ttl_s=0.2)
        time.sleep(0.3)  # a refresh or more fails too, silently
        lease.move_to(f"{tmp_path}/v2")
        lease.release()
    assert caplog.text.count("cannot write a lease") == 1 and "--grace-minutes" in caplog.text


def test_a_lease_is_refreshed_moved_and_released(tmp_path: Path) -> None:
    lease = VersionLease(f"{tmp_path}/v1", ttl_s=0.4)
    path = Path(lease.path)
    first = ReaderLease.from_json(path.read_text())
    assert (first.version, first.reader) == ("v1", lease.reader)
    time.sleep(0.35)
    refreshed = ReaderLease.from_json(path.read_text())
    assert refreshed.expires_at > first.expires_at and refreshed.live(utc_now())
    lease.move_to(f"{tmp_path}/v2")
    assert ReaderLease.from_json(path.read_text()).version == "v2"
    lease.release()
    assert not path.exists() and list((tmp_path / LEASES_DIR).iterdir()) == []


@pytest.mark.slow
def test_a_trainer_streaming_an_old_version_keeps_it_while_gc_keep_1_runs(tmp_path: Path, tiny_bert: str,
                                                                          subprocess_env) -> None:
    root = tmp_path / "dataset"
    rows = factory.sequence_rows(factory.read_texts(limit=30), max_length=64)
    factory.write_dataset(str(root), rows[:24], shards=3, row_group_size=4, version="v1")
    out = tmp_path / "train"
    # 3 steps an epoch, 4 epochs: the trainer opens v1 (and writes its lease), then loads the model,
    # and re-reads every shard of v1 each epoch, all after gc ran.
    trainer = subprocess.Popen(
        [sys.executable, "-m", "maskstream", "train", "--dataset", f"{root}/v1", "--output", str(out), "--model",
         tiny_bert, "--batch-size", "8", "--max-steps", "12", "--num-workers", "1", "--eval-samples", "4",
         "--eval-every", "100000", "--save-every", "100000", "--log-every", "3"],
        env=subprocess_env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (root / LEASES_DIR).exists() or not list((root / LEASES_DIR).glob("*.json")):
            assert trainer.poll() is None and time.monotonic() < deadline, "the trainer wrote no lease"
            time.sleep(0.1)
        factory.write_dataset(str(root), rows, shards=1, row_group_size=20, version="v2")  # latest -> v2
        removed = collect_garbage(str(root), keep=1, grace_minutes=0)  # no grace: only the lease protects v1
        assert removed["versions"] == [] and removed["kept"][0].startswith("v1: leased by ")
        assert trainer.poll() is None, "the trainer finished before gc ran: the test proves nothing"
        output, _ = trainer.communicate(timeout=600)
    finally:
        trainer.kill()
    assert trainer.returncode == 0, output[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 12
    epochs = [json.loads(line).get("epoch") for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(e for e in epochs if e is not None) == 3  # v1's shards were read in 4 epochs after gc
    # The lease went with the trainer: now gc removes v1.
    assert list((root / LEASES_DIR).glob("*.json")) == []
    assert collect_garbage(str(root), keep=1, grace_minutes=0)["versions"] == ["v1"]


def test_a_version_being_built_under_a_lease_and_the_cache_are_left_alone(tmp_path: Path) -> None:
    write_version(tmp_path, "v1", created_minutes_ago=100, latest=True)
    (tmp_path / "v2-building").mkdir()
    shard = tmp_path / "v2-building" / "shard-00000-of-00001.parquet"
    shard.write_bytes(b"written an hour ago, the build goes on")
    an_hour_ago = time.time() - 3600
    os.utime(shard, (an_hour_ago, an_hour_ago))
    entry = tmp_path / "_cache" / "files" / "an-entry-the-build-just-wrote"
    entry.mkdir(parents=True)
    (entry / "entry.json").write_text("{}")
    os.utime(entry / "entry.json", (an_hour_ago, an_hour_ago))
    write_lease(tmp_path, "watch-7", "v2-building", expires_minutes=4)
    removed = collect_garbage(str(tmp_path), keep=1, grace_minutes=1)
    assert removed["incomplete"] == [] and removed["files"] == []
    assert removed["kept"] == ["v2-building: leased by watch-7", "cache: v2-building being built"]
    (tmp_path / LEASES_DIR / "watch-7.json").unlink()  # the build was killed and its lease is gone
    removed = collect_garbage(str(tmp_path), keep=1, grace_minutes=1)
    assert removed["incomplete"] == ["v2-building"] and removed["files"] == ["an-entry-the-build-just-wrote"]

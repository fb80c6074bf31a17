"""LatestVersionFollower: switches only to a newer complete version with the same tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path

from maskstream.schemas.manifest import LATEST_POINTER, MANIFEST_NAME, Manifest
from maskstream.trainer.follow import LatestVersionFollower, dataset_root


def write_version(root: Path, version: str, seeds: list[str], vocab_hash: str = "v1", *, complete: bool = True) -> None:
    manifest = Manifest(version=version, created_at="2026-01-01T00:00:00+00:00",
                        tokenizer={"name": "t", "vocab_hash": vocab_hash}, encoder={}, seeds=seeds, formulas={},
                        config={}, source_fingerprint={}, shards=[])
    (root / version).mkdir(parents=True)
    if complete:
        (root / version / MANIFEST_NAME).write_text(manifest.to_json())
        (root / LATEST_POINTER).write_text(version + "\n")


def test_follows_latest_with_the_same_tokenizer_only(tmp_path: Path, caplog) -> None:
    write_version(tmp_path, "a", ["gene", "protein"])
    first = Manifest.from_json((tmp_path / "a" / MANIFEST_NAME).read_text())
    follower = LatestVersionFollower(str(tmp_path), f"{tmp_path}/a", first)
    assert follower.poll() is None
    write_version(tmp_path, "b", ["gene", "ligand"], complete=False)  # being written: latest did not move
    assert follower.poll() is None
    write_version(tmp_path, "c", ["gene"], vocab_hash="other")
    with caplog.at_level(logging.WARNING):
        assert follower.poll() is None
    assert "another tokenizer" in caplog.text
    write_version(tmp_path, "d", ["gene", "ligand", "docking"])
    with caplog.at_level(logging.INFO):
        switch = follower.poll()
    assert switch is not None and switch.version_url == f"{tmp_path}/d"
    assert (switch.seeds_added, switch.seeds_removed) == (["docking", "ligand"], ["protein"])
    assert "seeds added: docking ligand; removed: protein" in caplog.text
    assert follower.poll() is None


def test_dataset_root_of_a_version_folder() -> None:
    assert dataset_root("gs://b/data/v1", "gs://b/data/v1") == "gs://b/data"
    assert dataset_root("gs://b/data/", "gs://b/data/v1") == "gs://b/data"


def test_a_strategy_reading_peer_signals_skips_a_version_without_them(tmp_path, debian_rows):
    from maskstream.schemas.manifest import load_manifest
    from testing import sequence_dataset as factory

    root = str(tmp_path / "root")
    first = factory.write_dataset(root, debian_rows[:20], shards=1, version="v1")
    factory.write_dataset(root, debian_rows[:30], shards=1, version="v2")
    url, manifest = load_manifest(first)
    assert LatestVersionFollower(root, url, manifest, needs_peer_signals=True).poll() is None
    assert LatestVersionFollower(root, url, manifest).poll().manifest.version == "v2"

"""The bounded local shard cache (issue 41 item 4), against the GCS emulator: a second epoch reads no
shard bytes from the bucket when the cache holds the dataset, the cache never exceeds its limit, the
least recently used shard goes first, and a corrupted download is refused by sha256."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from maskstream.schemas.manifest import load_manifest
from maskstream.trainer.dataset import ChecksumMismatch, StreamingSequenceDataset
from maskstream.trainer.loader import build_dataloader
from maskstream.trainer.shard_cache import ShardCache


def remote_copy(local_dataset: str, bucket: str, name: str) -> str:
    fsspec.filesystem("gcs").put(local_dataset, f"{bucket}/{name}", recursive=True)
    return f"{bucket}/{name}"


def epoch_rows(dataset: StreamingSequenceDataset, epoch: int, num_workers: int = 0) -> list[int]:
    dataset.set_epoch(epoch)
    loader = build_dataloader(dataset, batch_size=16, num_workers=num_workers, strategy=None, masking=None)
    return sorted(i for batch in loader for i in batch["sample_index"].tolist())


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_second_epoch_reads_no_shard_from_the_bucket(local_dataset, gcs_bucket, tmp_path, num_workers):
    root = remote_copy(local_dataset, gcs_bucket, "data")
    version_url, manifest = load_manifest(root)
    total = sum(s.bytes for s in manifest.shards)
    cache = ShardCache(tmp_path / "cache", limit_bytes=total + 1)
    dataset = StreamingSequenceDataset(root, seed=3, shuffle_buffer=64, cache=cache)
    first = epoch_rows(dataset, 0, num_workers)
    assert first == list(range(manifest.total_rows))
    assert {p.name for p in (tmp_path / "cache").glob("*.parquet")} == {f"{s.sha256}.parquet" for s in manifest.shards}
    assert cache.cached_bytes() == total
    # Every shard gone from the bucket: epoch 2 can only read the cache (the footers were read at the start).
    gcs = fsspec.filesystem("gcs")
    for shard in manifest.shards:
        gcs.rm(f"{version_url}/{shard.path}".removeprefix("gs://"))
    assert epoch_rows(dataset, 1, num_workers) == first
    if num_workers == 0:
        assert cache.bytes_downloaded == total  # each shard downloaded once, in epoch 1


@pytest.mark.slow
def test_the_cache_stays_within_its_limit_and_evicts_the_least_recently_used(local_dataset, gcs_bucket, tmp_path,
                                                                             monkeypatch):
    root = remote_copy(local_dataset, gcs_bucket, "small")
    version_url, manifest = load_manifest(root)
    largest = max(s.bytes for s in manifest.shards)
    limit = 2 * largest  # room for two of the three shards
    cache = ShardCache(tmp_path / "cache", limit_bytes=limit)
    sizes = []
    original = ShardCache._make_room

    def watched(self, size):
        original(self, size)
        sizes.append(self.cached_bytes() + size)  # what the folder holds once this shard is in

    monkeypatch.setattr(ShardCache, "_make_room", watched)
    dataset = StreamingSequenceDataset(root, seed=1, shuffle_buffer=64, cache=cache)
    for epoch in range(3):
        assert epoch_rows(dataset, epoch) == list(range(manifest.total_rows))
        assert cache.cached_bytes() <= limit
    assert sizes and max(sizes) <= limit
    assert cache.bytes_downloaded > sum(s.bytes for s in manifest.shards)  # evicted shards came back

    # Least recently used first: three shards through a cache with room for two.
    lru = ShardCache(tmp_path / "lru", limit_bytes=limit)
    shards = [(f"{version_url}/{s.path}", s.sha256, s.bytes, s.path) for s in manifest.shards]

    def use(shard) -> Path:
        with lru.open(*shard) as f:
            return Path(f.name)

    first, second, third = (use(s) for s in shards)
    assert not first.exists() and second.exists() and third.exists()
    use(shards[1])  # second is now the most recently used
    use(shards[0])  # first comes back: third, the least recently used, goes
    assert first.exists() and second.exists() and not third.exists()
    assert lru.cached_bytes() <= limit


@pytest.mark.slow
def test_a_corrupted_shard_is_refused_and_not_cached(local_dataset, gcs_bucket, tmp_path):
    root = remote_copy(local_dataset, gcs_bucket, "bad")
    version_url, manifest = load_manifest(root)
    gcs = fsspec.filesystem("gcs")
    path = f"{version_url}/{manifest.shards[0].path}".removeprefix("gs://")
    data = bytearray(gcs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    gcs.pipe_file(path, bytes(data))
    cache = ShardCache(tmp_path / "cache", limit_bytes=10**9)
    dataset = StreamingSequenceDataset(root, seed=0, shuffle=False, cache=cache)
    with pytest.raises(ChecksumMismatch, match=manifest.shards[0].path):
        epoch_rows(dataset, 0)
    assert not (tmp_path / "cache" / f"{manifest.shards[0].sha256}.parquet").exists()
    assert not list((tmp_path / "cache" / ".partial").iterdir())


def test_a_cache_needs_a_limit(tmp_path):
    from maskstream.trainer.config import TrainConfig

    with pytest.raises(ValueError, match="--cache-limit"):
        TrainConfig(dataset="d", output="o", cache_dir=str(tmp_path))


@pytest.mark.slow
def test_train_reads_a_bucket_through_the_cache(local_dataset, gcs_bucket, tiny_bert, tmp_path):
    from maskstream.cli import main

    root = remote_copy(local_dataset, gcs_bucket, "train")
    _, manifest = load_manifest(root)
    assert main(["train", "--dataset", root, "--output", str(tmp_path / "out"), "--model", tiny_bert,
                 "--batch-size", "8", "--max-steps", "3", "--num-workers", "1", "--eval-samples", "8",
                 "--cache-dir", str(tmp_path / "cache"), "--cache-limit", str(10**9)]) == 0
    cached = {p.name for p in (tmp_path / "cache").glob("*.parquet")}
    assert cached and cached <= {f"{s.sha256}.parquet" for s in manifest.shards}

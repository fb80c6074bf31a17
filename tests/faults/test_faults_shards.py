"""Damaged datasets and corpora: every failure names the file it comes from.

- one flipped byte inside a shard: the checksum names the shard (the loader; `maskstream
  inspect` in test_faults_build.py);
- a truncated Parquet file: the loader names the shard at start-up, the corpus reader rejects
  the file with the reason;
- a manifest or `latest` pointer whose path leaves the dataset version (`../`, an absolute path,
  another bucket, another scheme) is refused before anything is opened.
"""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from maskstream.pipelines.read_corpus import ReadCorpus
from maskstream.schemas.manifest import ManifestError, load_manifest
from maskstream.trainer.dataset import ChecksumMismatch, StreamingSequenceDataset
from maskstream.trainer.loader import build_dataloader

SHARD = "shard-00001-of-00002.parquet"


def flip_one_byte(path: Path) -> None:
    """Flips one bit of the byte in the middle of the file (a data page: the footer stays valid)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_one_corrupted_byte_is_reported_by_name(dataset_copy: Path) -> None:
    flip_one_byte(dataset_copy / "v1" / SHARD)
    dataset = StreamingSequenceDataset(str(dataset_copy), shuffle=False)  # footers are still fine
    with pytest.raises(ChecksumMismatch, match=rf"shard {SHARD} of \S+/v1: sha256 \w+ does not match"):
        list(dataset)
    # Through a DataLoader worker process too: the error reaches the training loop with the name.
    loader = build_dataloader(StreamingSequenceDataset(str(dataset_copy), shuffle=False), batch_size=16,
                              num_workers=1, strategy=None, masking=None)
    with pytest.raises(ChecksumMismatch, match=SHARD):
        list(loader)


def test_the_shard_before_the_damaged_one_is_read_whole(dataset_copy: Path) -> None:
    """The error comes when the damaged shard is reached, not before: rows already read are good."""
    flip_one_byte(dataset_copy / "v1" / SHARD)
    got = []
    with pytest.raises(ChecksumMismatch):
        # Windows of 20 rows: a window is read just before its rows are yielded.
        for sample in StreamingSequenceDataset(str(dataset_copy), shuffle=False, shuffle_buffer=20):
            got.append(sample["sample_index"])
    assert got == list(range(60))  # shard 0 holds rows 0..59


def truncate(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_truncated_shard_is_named_when_the_loader_starts(dataset_copy: Path) -> None:
    truncate(dataset_copy / "v1" / SHARD)
    with pytest.raises(ManifestError, match=rf"shard {SHARD} of \S+/v1 cannot be read: .*(magic|footer|size)"):
        StreamingSequenceDataset(str(dataset_copy))


@pytest.mark.slow
def test_truncated_parquet_in_the_corpus_is_a_reject(tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": ["alpha beta", "gamma delta"]}), good)
    cut = tmp_path / "cut.parquet"
    pq.write_table(pa.table({"text": [f"document number {i}" for i in range(500)]}), cut)
    truncate(cut)
    with BeamTestPipeline() as p:
        corpus = p | ReadCorpus([str(tmp_path / "*.parquet")])
        assert_that(corpus["documents"] | beam.Map(lambda d: d.text), equal_to(["alpha beta", "gamma delta"]),
                    label="Documents")
        reasons = corpus["rejects"] | beam.Map(lambda r: (r["source"].rsplit("/", 1)[1], r["location"],
                                                          r["reason"].split(":")[0]))
        assert_that(reasons, equal_to([("cut.parquet", "file", "not a Parquet file")]), label="Rejects")


def write_manifest(root: Path, change) -> None:
    path = root / "v1" / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "bad_path",
    [
        "../v0/shard-00000-of-00002.parquet",
        "sub/../../outside.parquet",
        "/etc/passwd",
        "gs://another-bucket/v1/shard-00000-of-00002.parquet",
        "file:///etc/passwd",
        "C:/data/shard.parquet",
        "..\\outside.parquet",
        "",
    ],
)
def test_manifest_paths_outside_the_version_are_refused(dataset_copy: Path, bad_path: str) -> None:
    def change(manifest):
        manifest["shards"][1]["path"] = bad_path

    write_manifest(dataset_copy, change)
    with pytest.raises(ManifestError, match="shard path .* (is not relative to|leaves) the dataset version"):
        load_manifest(str(dataset_copy))
    with pytest.raises(ManifestError):
        StreamingSequenceDataset(str(dataset_copy))


def test_word_table_path_and_latest_pointer_are_checked_too(dataset_copy: Path) -> None:
    write_manifest(dataset_copy, lambda m: m.update(word_table="../../words.parquet"))
    with pytest.raises(ManifestError, match="leaves the dataset version"):
        load_manifest(str(dataset_copy / "v1"))
    (dataset_copy / "latest").write_text("../elsewhere")
    with pytest.raises(ManifestError, match="leaves the dataset version"):
        load_manifest(str(dataset_copy))
    (dataset_copy / "latest").write_text("gs://another-bucket/dataset/v1")
    with pytest.raises(ManifestError, match="not relative"):
        load_manifest(str(dataset_copy))

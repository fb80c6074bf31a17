"""The incremental path on gs:// (the local emulator): update into a bucket, watch a bucket
prefix once, and a trainer following `latest` there."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import fsspec
import pytest
from apache_beam.internal.gcp import auth

from maskstream.cli import build_parser
from maskstream.cli.update import update_options
from maskstream.schemas.manifest import load_manifest


@pytest.fixture()
def beam_anonymous_gcs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beam's GCS client anonymous from the start (see tests/pipelines/test_corpus_gcs.py)."""
    monkeypatch.setattr(auth._Credentials, "_credentials_init", True)
    monkeypatch.setattr(auth._Credentials, "_credentials", None)


@pytest.mark.slow
def test_update_watch_and_follow_on_gcs(gcs_bucket: str, sample_corpus: Path, beam_anonymous_gcs, caplog,
                                        tiny_bert: str, tmp_path) -> None:
    from maskstream.pipelines.update.incremental import update
    from maskstream.pipelines.update.watch import EXIT_BUILT, EXIT_UNCHANGED, Watcher
    from maskstream.trainer.follow import LatestVersionFollower

    fs, _ = fsspec.core.url_to_fs(gcs_bucket)
    lines = sample_corpus.read_text(encoding="utf-8").splitlines()[:40]
    for i in range(20):
        fs.pipe(f"{gcs_bucket}/corpus/part-{i:02d}.jsonl", ("\n".join(lines[2 * i : 2 * i + 2]) + "\n").encode())
    corpus, root = f"{gcs_bucket}/corpus", f"{gcs_bucket}/dataset"

    args, _ = build_parser().parse_known_args(["update", "--input", f"{corpus}/*.jsonl", "--output", root,
                                               "--top-k", "5"])
    first = update(update_options(args, args.input, args.output))
    assert first["counts"]["files_processed"] == 20
    url, manifest = load_manifest(root)
    assert url == first["version"] and url.startswith("gs://")
    follower = LatestVersionFollower(root, url, manifest)
    assert follower.poll() is None

    # A new file whose words outrank the old seeds.
    text = " ".join(["quasicrystal lattice diffraction"] * 30)
    fs.pipe(f"{corpus}/part-99.jsonl", "".join(json.dumps({"text": text}) + "\n" for _ in range(3)).encode())
    watch_args, _ = build_parser().parse_known_args(["watch", corpus, "--output", root, "--top-k", "5"])
    watcher = Watcher(corpus, update_options(watch_args, [], root), interval=0.2, settle=0.2)
    with caplog.at_level(logging.INFO):
        assert watcher.check() == EXIT_BUILT
        assert "1 added" in caplog.text and "part-99.jsonl" in caplog.text
        assert "counted and tokenized 1 of 21 files" in caplog.text
    assert Watcher(corpus, update_options(watch_args, [], root), interval=0.2, settle=0.2).check() == EXIT_UNCHANGED

    with caplog.at_level(logging.INFO):
        switch = follower.poll()
    assert switch is not None and switch.version_url == load_manifest(root)[0] != url
    assert {"quasicrystal", "lattice", "diffraction"} & set(switch.seeds_added)
    assert set(switch.seeds_removed) == set(manifest.seeds) - set(switch.manifest.seeds)
    assert "switching from dataset version" in caplog.text
    assert follower.poll() is None

    # Training from the bucket starts on the first version and moves to the newest at the epoch boundary.
    from maskstream.cli import main
    from maskstream.trainer.metrics import read_metrics

    out = tmp_path / "train"
    with caplog.at_level(logging.INFO):
        assert main(["train", "--dataset", url, "--follow-latest", "--output", str(out), "--model", tiny_bert,
                     "--batch-size", "16", "--epochs", "3", "--num-workers", "0", "--held-out-fraction", "0",
                     "--log-every", "1", "--eval-every", "1000", "--save-every", "1000"]) == 0
    assert f"switching from dataset version {manifest.version} to {switch.manifest.version}" in caplog.text
    epochs = {r["epoch"] for r in read_metrics(out) if r["split"] == "train"}
    assert epochs >= {0, 1}


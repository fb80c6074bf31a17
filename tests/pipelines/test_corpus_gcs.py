"""Reading a corpus from gs:// through Beam's own GCS IO, against the local emulator."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import fsspec
import pytest
from apache_beam.internal.gcp import auth
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from maskstream.pipelines.corpus import Document, corpus_fingerprint, expand_inputs
from maskstream.pipelines.read_corpus import ReadCorpus


@pytest.fixture()
def beam_anonymous_gcs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beam's GCS client, anonymous from the start.

    Without application default credentials Beam retries `google.auth.default()` with
    exponential backoff (about 20 s per process) before it connects anonymously, which is what
    the emulator wants; this presets Beam's per-process credentials cache to that outcome.
    """
    monkeypatch.setattr(auth._Credentials, "_credentials_init", True)
    monkeypatch.setattr(auth._Credentials, "_credentials", None)


@pytest.mark.slow
def test_read_corpus_from_gcs_glob(gcs_emulator: str, gcs_bucket: str, sample_corpus: Path, beam_anonymous_gcs):
    fs, _ = fsspec.core.url_to_fs(gcs_bucket)
    lines = sample_corpus.read_text(encoding="utf-8").splitlines()[:20]
    fs.pipe(f"{gcs_bucket}/corpus/part-0.jsonl", ("\n".join(lines[:10]) + "\n").encode())
    fs.pipe(f"{gcs_bucket}/corpus/part-1.jsonl", ("\n".join(lines[10:]) + "\nnot json\n").encode())
    pattern = f"{gcs_bucket}/corpus/*.jsonl"
    part0, part1 = f"{gcs_bucket}/corpus/part-0.jsonl", f"{gcs_bucket}/corpus/part-1.jsonl"
    assert expand_inputs([pattern]) == [part0, part1]
    fingerprint = corpus_fingerprint([pattern])
    assert [f["bytes"] for f in fingerprint["files"]] == [fs.size(part0), fs.size(part1)]
    expected = [
        Document(f"{path}:line {i + 1}", path, json.loads(line)["text"])
        for path, chunk in ((part0, lines[:10]), (part1, lines[10:]))
        for i, line in enumerate(chunk)
    ]
    with TestPipeline() as p:
        out = p | ReadCorpus([pattern])
        assert_that(out["documents"], equal_to(expected), label="Documents")
        assert_that(
            out["rejects"] | beam.Map(lambda r: (r["source"], r["location"])),
            equal_to([(part1, "line 11")]),
            label="Rejects",
        )


@pytest.mark.slow
def test_stats_and_seeds_on_gcs(gcs_bucket: str, sample_corpus: Path, beam_anonymous_gcs, capsys):
    """The whole stats -> seeds path with every input and output in the bucket (in process, so
    that Beam's credentials cache above applies)."""
    from maskstream.cli import main

    fs, _ = fsspec.core.url_to_fs(gcs_bucket)
    lines = sample_corpus.read_text(encoding="utf-8").splitlines()[:200]
    fs.pipe(f"{gcs_bucket}/corpus/a.jsonl", ("\n".join(lines[:100]) + "\n").encode())
    fs.pipe(f"{gcs_bucket}/corpus/b.jsonl", ("\n".join(lines[100:]) + "\n{broken\n").encode())
    stats = f"{gcs_bucket}/stats"
    assert main(["stats", "--input", f"{gcs_bucket}/corpus/*.jsonl", "--output", stats]) == 0
    assert "documents read: 201, accepted: 200, rejected: 1" in capsys.readouterr().out
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(stats, detail=False))
    assert names == ["rejects-00000-of-00001.jsonl", "summary.json", "word_stats-00000-of-00001.parquet"]
    assert not [p for p in fs.ls(gcs_bucket, detail=False) if ".tmp-" in p]  # staging removed
    summary = json.loads(fs.cat(f"{stats}/summary.json"))
    assert summary["N"] == 200 and len(summary["source_fingerprint"]["files"]) == 2
    assert main(["seeds", "--stats", stats, "--output", f"{gcs_bucket}/seeds/seeds.json"]) == 0
    seeds = json.loads(fs.cat(f"{gcs_bucket}/seeds/seeds.json"))
    assert len(seeds["seeds"]) == 20 and seeds["source_fingerprint"] == summary["source_fingerprint"]
    assert fs.exists(f"{gcs_bucket}/seeds/seeds_report.md") and fs.exists(f"{gcs_bucket}/seeds/seeds.png")


@pytest.mark.slow
def test_a_refused_listing_is_an_error_not_an_empty_match(gcs_emulator: str, gcs_bucket: str, beam_anonymous_gcs,
                                                          monkeypatch):
    """A 403 (a bucket the credentials may not list) names the pattern and the refusal; only a missing
    object or bucket is "matches no file". The emulator has no permissions: a proxy in front of it
    answers 403 to every request for the bucket."""
    from tests.faults.test_faults_storage import start_proxy

    fs, _ = fsspec.core.url_to_fs(gcs_bucket)
    fs.pipe(f"{gcs_bucket}/corpus/part-0.jsonl", b'{"text": "one"}\n')
    bucket = gcs_bucket.removeprefix("gs://").split("/")[0]
    proxy = start_proxy(gcs_emulator, {bucket: 1_000}, status=403)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{proxy.server_address[1]}")
        with pytest.raises(OSError, match=r"cannot list gs://.*corpus/\*\.jsonl: Forbidden: ") as refused:
            expand_inputs([f"{gcs_bucket}/corpus/*.jsonl"])
        assert not isinstance(refused.value, FileNotFoundError)
    finally:
        proxy.shutdown()
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    with pytest.raises(FileNotFoundError, match="matches no file"):  # through the emulator itself
        expand_inputs([f"{gcs_bucket}/missing/*.jsonl"])

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

from pipelines.corpus import Document, ReadCorpus, corpus_fingerprint, expand_inputs


@pytest.fixture()
def beam_anonymous_gcs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beam's GCS client, anonymous from the start.

    Without application default credentials Beam retries `google.auth.default()` with
    exponential backoff (about 20 s per process) before it connects anonymously, which is what
    the emulator wants; this presets Beam's per-process credentials cache to that outcome.
    """
    monkeypatch.setattr(auth._Credentials, "_credentials_init", True)
    monkeypatch.setattr(auth._Credentials, "_credentials", None)


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

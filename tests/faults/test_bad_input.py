"""Bad input, one kind per row of docs/scale.md's "Bad input" table: each gives a reject with its
file, location and reason, or a clear error, and loses nothing silently
(documents read = accepted + rejected)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maskstream.schemas.manifest import ManifestError
from maskstream.trainer.dataset import StreamingSequenceDataset
from tests.conftest import run_cli

GOOD_TEXTS = [
    "Numerical library for sparse linear algebra and eigenvalue solvers",
    "Molecular dynamics simulation package with force fields",
    "Library for fast Fourier transforms in one or more dimensions",
]


def write_bad_corpus(folder: Path) -> dict[tuple[str, str], str]:
    """Writes one file per bad input kind next to a good one; returns the expected rejects as
    {(file, location): start of the reason}."""
    folder.mkdir()
    (folder / "good.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in GOOD_TEXTS))
    (folder / "latin1.txt").write_bytes("café au lait\nplain line\n".encode("latin-1"))
    (folder / "empty.txt").write_bytes(b"")
    (folder / "empty.jsonl").write_bytes(b"")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), folder / "empty.parquet")
    (folder / "blank.txt").write_text("\n   \n")
    (folder / "empty_doc.jsonl").write_text(json.dumps({"text": ""}) + "\n" + json.dumps({"text": " \t"}) + "\n")
    # Binary content under a text name: no newline and no valid UTF-8 in it.
    (folder / "binary.txt").write_bytes(bytes(range(128, 256)) * 8)
    (folder / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    (folder / "nofield.jsonl").write_text(json.dumps({"body": "text under another name"}) + "\n")
    pq.write_table(pa.table({"body": ["text under another name"]}), folder / "nocolumn.parquet")
    pq.write_table(pa.table({"text": [f"document {i}" for i in range(2000)]}), folder / "cut.parquet")
    data = (folder / "cut.parquet").read_bytes()
    (folder / "cut.parquet").write_bytes(data[: len(data) // 2])
    whole = gzip.compress("".join(json.dumps({"text": f"line {i} of a long file"}) + "\n" for i in range(5000)).encode())
    (folder / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    return {
        ("latin1.txt", "line 1"): "not UTF-8: byte 0xe9 at offset 3",
        ("empty.txt", "file"): "empty file (no documents)",
        ("empty.jsonl", "file"): "empty file (no documents)",
        ("empty.parquet", "file"): "empty file (no documents)",
        ("blank.txt", "line 1"): "empty document",
        ("blank.txt", "line 2"): "empty document",
        ("empty_doc.jsonl", "line 1"): "empty document",
        ("empty_doc.jsonl", "line 2"): "empty document",
        ("binary.txt", "line 1"): "not UTF-8: byte 0x80 at offset 0",
        ("image.png", "file"): "unsupported file type",
        ("nofield.jsonl", "line 1"): "no field 'text'",
        ("nocolumn.parquet", "file"): "no column 'text' (columns: body)",
        ("cut.parquet", "file"): "not a Parquet file",
        ("cut.jsonl.gz", "file"): "compressed data ends early or is corrupt after line",
    }


def read_rejects(stats: Path) -> list[dict[str, str]]:
    return [json.loads(line) for path in sorted(stats.glob("rejects-*.jsonl")) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_every_bad_input_kind_is_a_reject_with_its_reason(tmp_path: Path, subprocess_env) -> None:
    expected = write_bad_corpus(tmp_path / "corpus")
    stats = tmp_path / "stats"
    result = run_cli(["stats", "--input", str(tmp_path / "corpus"), "--output", str(stats)], subprocess_env)
    rejects = read_rejects(stats)
    got = {(Path(r["source"]).name, r["location"]): r["reason"] for r in rejects}
    assert len(got) == len(rejects)  # one reject per record
    assert set(got) == set(expected)
    for key, reason in expected.items():
        assert got[key].startswith(reason), (key, got[key])
    summary = json.loads((stats / "summary.json").read_text())
    accepted = len(GOOD_TEXTS) + 1 + int(got[("cut.jsonl.gz", "file")].split("after line ")[1].split(",")[0])
    assert summary["documents_accepted"] == accepted  # good.jsonl, latin1.txt line 2, cut.jsonl.gz up to the cut
    assert summary["documents_rejected"] == len(expected)
    assert summary["documents_read"] == summary["documents_accepted"] + summary["documents_rejected"]
    assert f"rejected: {len(expected)}" in result.stdout


@pytest.mark.slow
def test_no_word_passing_the_seed_filters_is_an_error(tmp_path: Path, subprocess_env) -> None:
    corpus = tmp_path / "stop.txt"
    corpus.write_text("the and of it\nto be or not to be\nit is at an\n")  # stop words and short words only
    run_cli(["stats", "--input", str(corpus), "--output", str(tmp_path / "stats")], subprocess_env)
    result = run_cli(["seeds", "--stats", str(tmp_path / "stats"), "--output", str(tmp_path / "seeds.json")],
                     subprocess_env, check=False)
    assert result.returncode == 2
    assert "no word of" in result.stderr and "passes the filters" in result.stderr
    assert not (tmp_path / "seeds.json").exists()


def test_dataset_of_an_unknown_schema_version_is_refused(dataset_copy: Path) -> None:
    path = dataset_copy / "v1" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": 2}))
    with pytest.raises(ManifestError, match=r"unknown dataset schema version 2; this maskstream reads \(1,\)"):
        StreamingSequenceDataset(str(dataset_copy))


def write_one_line_document(path: Path, size: int) -> None:
    """A single line of `size` bytes of real text (the shipped corpus repeated), between two short lines."""
    texts = [json.loads(line)["text"].replace("\n", " ") for line in (Path(__file__).parents[2] / "data" /
                                                                       "debian-science.jsonl").open()]
    block = " ".join(texts).encode()
    with path.open("wb") as f:
        f.write(b"a short first document\n")
        written = 0
        while written < size:
            chunk = block[: size - written]
            f.write(chunk)
            written += len(chunk)
        f.write(b"\na short last document\n")


# Runs `maskstream ARGS` and prints the peak RSS (MB) of it and its children: a fresh parent, so no
# other child of the test process counts.
PEAK_RSS = """
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "maskstream", *sys.argv[1:]], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


@pytest.mark.slow
def test_a_50_mb_single_line_document_is_rejected_unread(tmp_path: Path, subprocess_env, repo_root: Path) -> None:
    """Over MAX_DOCUMENT_BYTES: one reject naming the size, by stats and build alike, in little memory
    (before the limit, stats took 1 GB for it and build over 6 GB)."""
    corpus = tmp_path / "big.txt"
    write_one_line_document(corpus, 50_000_000)
    stats, seeds = tmp_path / "stats", tmp_path / "seeds.json"
    seeds.write_text(json.dumps({"seeds": [{"word": "document"}, {"word": "short"}]}))
    commands = {
        "stats": ["stats", "--input", str(corpus), "--output", str(stats)],
        "build": ["build", "--input", str(corpus), "--stats", str(stats), "--seeds", str(seeds), "--output",
                  str(tmp_path / "dataset"), "--version", "v1", "--encoder-threads", "1"],
    }
    for name, args in commands.items():
        result = subprocess.run([sys.executable, "-c", PEAK_RSS, *args], env=subprocess_env, cwd=repo_root,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
        peak_mb = float(result.stdout.split()[-1])
        assert peak_mb < 1200, f"{name} peaked at {peak_mb:.0f} MB RSS"
    expected = {"source": str(corpus), "location": "line 2", "reason": (
        "document of 50000000 bytes is over the 16 MiB limit (maskstream.pipelines.corpus.MAX_DOCUMENT_BYTES); "
        "split it into smaller documents")}
    assert read_rejects(stats) == [expected]
    summary = json.loads((stats / "summary.json").read_text())
    assert (summary["documents_accepted"], summary["documents_rejected"]) == (2, 1)
    built = [json.loads(line) for path in sorted((tmp_path / "dataset" / "v1").glob("rejects-*.jsonl"))
             for line in path.read_text().splitlines()]
    assert built == [expected]


@pytest.mark.slow
def test_documents_over_the_limit_are_rejects_in_every_format(tmp_path: Path) -> None:
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from maskstream.pipelines.read_corpus import ReadCorpus

    limit = 64
    long_text = "word " * 40  # 200 bytes
    json_line = len(json.dumps({"text": long_text}))
    (tmp_path / "a.txt").write_text(f"short one\n{long_text}\nshort two\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": long_text}) + "\n" + json.dumps({"text": "fine"}) + "\n")
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress((json.dumps({"text": long_text}) + "\n").encode()))
    pq.write_table(pa.table({"text": ["fine", long_text]}), tmp_path / "d.parquet")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "whole.txt").write_text(long_text)
    with BeamTestPipeline() as p:
        lines = p | "Lines" >> ReadCorpus([str(tmp_path / "*.*")], max_document_bytes=limit)
        files = p | "Files" >> ReadCorpus([str(tmp_path / "e")], txt_mode="file", max_document_bytes=limit)
        assert_that(lines["documents"] | beam.Map(lambda d: d.text),
                    equal_to(["short one", "short two", "fine", "fine"]), label="Documents")
        rejects = ((lines["rejects"], files["rejects"]) | beam.Flatten()
                   | beam.Map(lambda r: (Path(r["source"]).name, r["location"], r["reason"].split(" is over")[0])))
        assert_that(rejects, equal_to([
            ("a.txt", "line 2", "document of 200 bytes"),
            ("b.jsonl", "line 1", f"document of {json_line} bytes"),  # the whole JSON line
            ("c.jsonl.gz", "line 1", f"document of {json_line} bytes"),
            ("d.parquet", "row 2", "document of 200 bytes"),
            ("whole.txt", "file", "document of 200 bytes"),
        ]), label="Rejects")


def test_inspect_refuses_an_unknown_schema_version(dataset_copy: Path, tmp_path: Path, capsys) -> None:
    from maskstream.cli import main

    path = dataset_copy / "v1" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": 2}))
    assert main(["inspect", str(dataset_copy), "--plot", str(tmp_path / "p.png")]) == 1
    assert "error: unknown dataset schema version 2; this maskstream reads (1,)" in capsys.readouterr().err

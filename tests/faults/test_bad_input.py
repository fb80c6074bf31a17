"""Bad input, one kind per row of the README's "Bad input" table: each gives a reject with its
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

from schemas.manifest import ManifestError
from tests.conftest import run_cli
from trainer.dataset import StreamingSequenceDataset

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
def test_a_50_mb_single_line_document(tmp_path: Path, subprocess_env, repo_root: Path) -> None:
    corpus = tmp_path / "big.txt"
    write_one_line_document(corpus, 50_000_000)
    result = subprocess.run([sys.executable, "-c", PEAK_RSS, "stats", "--input", str(corpus), "--output",
                             str(tmp_path / "stats")], env=subprocess_env, cwd=repo_root, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    peak_mb = float(result.stdout.split()[-1])
    summary = json.loads((tmp_path / "stats" / "summary.json").read_text())
    assert (summary["documents_accepted"], summary["documents_rejected"]) == (3, 0)
    assert summary["total_words"] > 7_000_000
    # Bounded by a small multiple of the line (its bytes, its text, its words), not more.
    assert peak_mb < 1600, f"stats peaked at {peak_mb:.0f} MB RSS"

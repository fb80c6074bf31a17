"""ReadCorpus, expand_inputs and corpus_fingerprint on real files of every supported kind, good and bad."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from maskstream.pipelines.corpus import Document, corpus_fingerprint, expand_inputs
from maskstream.pipelines.read_corpus import ReadCorpus


def read(patterns, tmp_path: Path, **kwargs) -> tuple[list[Document], list[dict]]:
    """Runs ReadCorpus and returns (documents, rejects) as written out by the pipeline."""
    with TestPipeline() as p:
        out = p | ReadCorpus([str(x) for x in patterns], **kwargs)
        for name in ("documents", "rejects"):
            _ = (
                out[name]
                | f"Json{name}" >> beam.Map(json.dumps)
                | f"Write{name}" >> beam.io.WriteToText(str(tmp_path / f"_out_{name}"), shard_name_template="")
            )
    documents = [Document(*json.loads(x)) for x in (tmp_path / "_out_documents").read_text().splitlines()]
    rejects = [json.loads(x) for x in (tmp_path / "_out_rejects").read_text().splitlines()]
    return sorted(documents), sorted(rejects, key=lambda r: (r["source"], r["location"]))


@pytest.mark.slow
def test_txt_lines_with_bad_bytes_and_empty_lines(tmp_path: Path):
    path = tmp_path / "a.txt"
    path.write_bytes("first document\n\nthird caf\u00e9\nbad \xff byte\n   \nlast".encode("latin-1").replace(
        b"caf\xe9", "caf\u00e9".encode()))
    with TestPipeline() as p:
        out = p | ReadCorpus([str(path)])
        assert_that(
            out["documents"],
            equal_to([
                Document(f"{path}:line 1", str(path), "first document"),
                Document(f"{path}:line 3", str(path), "third caf\u00e9"),
                Document(f"{path}:line 6", str(path), "last"),
            ]),
            label="Documents",
        )
        assert_that(
            out["rejects"],
            equal_to([
                {"source": str(path), "location": "line 2", "reason": "empty document"},
                {"source": str(path), "location": "line 4", "reason": "not UTF-8: byte 0xff at offset 4"},
                {"source": str(path), "location": "line 5", "reason": "empty document"},
            ]),
            label="Rejects",
        )


@pytest.mark.slow
def test_txt_file_mode(tmp_path: Path):
    (tmp_path / "one.txt").write_text("a whole\nfile is one document\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes(b"ok \xc3\x28 not")
    documents, rejects = read([tmp_path / "*.txt"], tmp_path, txt_mode="file")
    assert documents == [Document(f"{tmp_path}/one.txt:file", f"{tmp_path}/one.txt", "a whole\nfile is one document\n")]
    assert sorted((r["source"].rsplit("/", 1)[1], r["location"], r["reason"]) for r in rejects) == [
        ("bad.txt", "file", "not UTF-8: byte 0xc3 at offset 3"),
        ("empty.txt", "file", "empty document"),
    ]


@pytest.mark.slow
def test_jsonl_every_bad_line(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    lines = [
        json.dumps({"body": "good one"}).encode(),
        b"{not json",
        json.dumps({"text": "wrong field"}).encode(),
        json.dumps({"body": 3}).encode(),
        json.dumps(["a", "list"]).encode(),
        json.dumps({"body": "  "}).encode(),
        b'{"body": "bad \xff byte"}',
        b"",
        json.dumps({"body": "caf\u00e9 ok"}, ensure_ascii=False).encode(),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    documents, rejects = read([path], tmp_path, text_field="body")
    assert [d.document_id for d in documents] == [f"{path}:line 1", f"{path}:line 9"]
    assert [d.text for d in documents] == ["good one", "caf\u00e9 ok"]
    reasons = {r["location"]: r["reason"] for r in rejects}
    assert reasons == {
        "line 2": "not JSON: Expecting property name enclosed in double quotes at column 2",
        "line 3": "no field 'body'",
        "line 4": "field 'body' is int, not a string",
        "line 5": "not a JSON object but list",
        "line 6": "empty document",
        "line 7": "not UTF-8: byte 0xff at offset 14",
        "line 8": "not JSON: Expecting value at column 1",
    }
    assert len(documents) + len(rejects) == len(lines)


@pytest.mark.slow
def test_compressed_jsonl_and_bom(tmp_path: Path):
    path = tmp_path / "d.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"\xef\xbb\xbf" + json.dumps({"text": "with a byte order mark"}).encode() + b"\n")
    documents, rejects = read([path], tmp_path)
    assert [d.text for d in documents] == ["with a byte order mark"] and rejects == []


@pytest.mark.slow
def test_parquet_rows_missing_column_and_nulls(tmp_path: Path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"content": ["alpha beta", None, "", "gamma"], "n": [1, 2, 3, 4]}), good)
    no_column = tmp_path / "no_column.parquet"
    pq.write_table(pa.table({"other": ["x"]}), no_column)
    not_text = tmp_path / "not_text.parquet"
    pq.write_table(pa.table({"content": [1, 2]}), not_text)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"this is not parquet")
    documents, rejects = read([tmp_path / "*.parquet"], tmp_path, text_field="content")
    assert [(d.document_id, d.text) for d in documents] == [(f"{good}:row 1", "alpha beta"), (f"{good}:row 4", "gamma")]
    got = sorted((Path(r["source"]).name, r["location"], r["reason"].split(":")[0]) for r in rejects)
    assert got == [
        ("broken.parquet", "file", "not a Parquet file"),
        ("good.parquet", "row 2", "column 'content' is null"),
        ("good.parquet", "row 3", "empty document"),
        ("no_column.parquet", "file", "no column 'content' (columns"),
        ("not_text.parquet", "file", "column 'content' is int64, not a string"),
    ]


@pytest.mark.slow
def test_unknown_file_type_is_a_reject(tmp_path: Path):
    (tmp_path / "notes.csv").write_text("a,b\n")
    documents, rejects = read([tmp_path / "notes.csv"], tmp_path)
    assert documents == [] and rejects[0]["location"] == "file" and "unsupported file type" in rejects[0]["reason"]


def test_expand_inputs_sorted_deduplicated_and_missing(tmp_path: Path):
    for name in ("b.txt", "a.txt"):
        (tmp_path / name).write_text("x\n")
    assert expand_inputs([str(tmp_path / "*.txt"), str(tmp_path / "a.txt")]) == [
        str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("y\n")
    assert expand_inputs([str(tmp_path)]) == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        expand_inputs([str(tmp_path / "a.txt"), str(tmp_path / "nope.jsonl")])
    with pytest.raises(FileNotFoundError, match=r"\*.parquet"):
        expand_inputs([str(tmp_path / "*.parquet")])


def test_a_local_folder_that_cannot_be_listed_is_not_said_to_match_nothing(tmp_path: Path, monkeypatch):
    """Issue 75: a PermissionError listing a local folder was reported as "matches no file". The tests run
    as root, whom no mode bit refuses, so the refusal is os.listdir's."""
    import maskstream.pipelines.corpus as corpus

    (tmp_path / "a.txt").write_text("x\n")

    def refused(folder):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(corpus.os, "listdir", refused)
    for pattern in (str(tmp_path), str(tmp_path / "*.txt")):
        with pytest.raises(OSError, match=r"^cannot list .*: PermissionError: .*Permission denied") as error:
            expand_inputs([pattern])
        assert not isinstance(error.value, FileNotFoundError)


def test_local_paths_are_listed_as_beams_filesystems_list_them(tmp_path: Path, monkeypatch):
    # Local paths without a glob are listed without Beam (`maskstream update` never imports it);
    # they must give exactly what Beam's FileSystems.match gives (`_matched_files`).
    from maskstream.pipelines.corpus import _local_files, _matched_files

    folder = tmp_path / "corpus"
    (folder / "nested").mkdir(parents=True)
    for name in ("a.jsonl", ".hidden.txt", "b.txt.gz", "nested/c.jsonl"):
        (folder / name).write_bytes(b"x\n")
    (folder / "link.jsonl").symlink_to(folder / "a.jsonl")
    (folder / "broken.jsonl").symlink_to(folder / "gone.jsonl")
    (folder / "folder-link").symlink_to(folder / "nested")
    monkeypatch.chdir(tmp_path)
    (folder / "odd\\name.jsonl").write_bytes(b"x\n")
    patterns = ["corpus", "corpus/", "./corpus", "./corpus/", str(folder), f"{folder}/", "corpus/a.jsonl",
                "corpus/link.jsonl", "corpus/broken.jsonl", "corpus/nested", "corpus/missing.jsonl", "missing",
                "corpus/*", "corpus/*.jsonl", "./corpus/*.jsonl", f"{folder}/*.jsonl", "corpus/*.txt*", "corpus/.*",
                "*.jsonl", "corpus/*.parquet", "missing/*.jsonl", "corpus/a*l"]
    for pattern in patterns:
        assert sorted(_local_files(pattern)) == sorted(_matched_files(pattern)), pattern
    # Patterns Beam's matching alone decides: ?, [...], **, globs in folders.
    assert all(_local_files(p) is None
               for p in ("corpus/?.jsonl", "corpus/[ab].jsonl", "corpus/**", "*/a.jsonl", "corpus/*/*.jsonl"))
    # Beam's * stops at a backslash too: a name holding one is not in the folder's listing.
    assert sorted(_local_files("corpus")) == sorted(f"corpus/{n}" for n in ("a.jsonl", ".hidden.txt", "b.txt.gz", "link.jsonl"))


def test_fingerprint_matches_hashlib(tmp_path: Path, sample_corpus: Path):
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(sample_corpus.read_bytes())
    first = corpus_fingerprint([str(sample_corpus)])
    data = sample_corpus.read_bytes()
    assert first["files"] == [{"path": str(sample_corpus), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    # The overall hash identifies content, not location.
    assert corpus_fingerprint([str(copy)])["sha256"] == first["sha256"]
    copy.write_bytes(data + b"\n")
    assert corpus_fingerprint([str(copy)])["sha256"] != first["sha256"]


@pytest.mark.slow
def test_sample_corpus_reads_whole(tmp_path: Path, sample_corpus: Path):
    documents, rejects = read([sample_corpus], tmp_path)
    expected = [json.loads(line)["text"] for line in sample_corpus.read_text(encoding="utf-8").splitlines()]
    assert rejects == []
    assert sorted(d.text for d in documents) == sorted(expected)
    assert len({d.document_id for d in documents}) == len(expected) == 2288

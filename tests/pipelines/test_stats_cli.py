"""`maskstream stats` and `maskstream seeds` end to end, as a user runs them, on the shipped sample."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from wordfreq import word_frequency

from maskstream.mask_signal.words import words
from maskstream.pipelines.statistics.stop_words import ENGLISH_STOP_WORDS as SHIPPED_STOP_WORDS
from maskstream.schemas.formulas import FORMULA_VERSIONS
from maskstream.schemas.tables import WORD_STATS_SCHEMA
from tests.conftest import run_cli


def read_stats(stats_dir: Path) -> pa.Table:
    files = sorted(str(p) for p in stats_dir.glob("word_stats-*.parquet"))
    return ds.dataset(files, format="parquet").to_table().sort_by("word")


def sample_texts(path: Path, limit: int | None = None) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()[:limit]
    return [json.loads(line)["text"] for line in lines]


@pytest.fixture(scope="module")
def sample_stats(tmp_path_factory, sample_corpus: Path, subprocess_env) -> Path:
    out = tmp_path_factory.mktemp("stats") / "stats"
    result = run_cli(["stats", "--input", str(sample_corpus), "--output", str(out)], subprocess_env)
    assert "documents read: 2288, accepted: 2288, rejected: 0" in result.stdout
    return out


@pytest.mark.slow
def test_counts_equal_counter_on_the_sample(sample_stats: Path, sample_corpus: Path):
    texts = sample_texts(sample_corpus)
    tf = Counter(w for t in texts for w in words(t))
    df = Counter(w for t in texts for w in set(words(t)))
    table = read_stats(sample_stats)
    assert table.schema.equals(WORD_STATS_SCHEMA)
    rows = {r["word"]: r for r in table.to_pylist()}
    assert {w: (r["tf"], r["df"]) for w, r in rows.items()} == {w: (tf[w], df[w]) for w in tf}
    total = sum(tf.values())
    for word in ("genome", "package", "the", "qiime", "octave"):
        f_g = word_frequency(word, "en")
        assert rows[word]["general_frequency"] == f_g
        assert rows[word]["tf_icf"] == pytest.approx(tf[word] / total * math.log(1 / max(f_g, 5e-9)), rel=1e-12)
    summary = json.loads((sample_stats / "summary.json").read_text())
    assert summary["documents_read"] == summary["documents_accepted"] == summary["N"] == len(texts)
    assert summary["documents_rejected"] == 0
    assert summary["distinct_words"] == len(tf) and summary["total_words"] == total
    assert summary["source_fingerprint"]["files"][0]["bytes"] == sample_corpus.stat().st_size
    assert summary["formulas"] == FORMULA_VERSIONS
    assert [p.read_text() for p in sample_stats.glob("rejects-*.jsonl")] == [""]


@pytest.mark.slow
def test_seeds_are_domain_words(sample_stats: Path, tmp_path: Path, subprocess_env):
    seeds_json = tmp_path / "out" / "seeds.json"
    result = run_cli(["seeds", "--stats", str(sample_stats), "--output", str(seeds_json)], subprocess_env)
    seeds = json.loads(seeds_json.read_text())
    words_ = [s["word"] for s in seeds["seeds"]]
    assert result.stdout.strip().endswith(" ".join(words_))
    assert len(words_) == 20 and len(set(words_)) == 20
    assert not set(words_) & ENGLISH_STOP_WORDS
    assert all(w.isalpha() and len(w) >= 3 for w in words_)
    assert all(s["df"] >= 3 for s in seeds["seeds"])
    scores = [s["tf_icf"] for s in seeds["seeds"]]
    assert scores == sorted(scores, reverse=True)
    # Domain words of a science/math/electronics corpus are among them.
    assert {"genome", "sequences", "alignment"} <= set(words_)
    # Every word scoring at least the last seed and passing the filters is a seed.
    table = read_stats(sample_stats).to_pylist()
    better = [r["word"] for r in table if r["tf_icf"] >= scores[-1] and r["df"] >= 3 and r["word"].isalpha()
              and len(r["word"]) >= 3 and r["word"] not in ENGLISH_STOP_WORDS]
    assert sorted(better) == sorted(words_)
    summary = json.loads((sample_stats / "summary.json").read_text())
    assert seeds["source_fingerprint"] == summary["source_fingerprint"]
    assert seeds["formulas"] == FORMULA_VERSIONS
    assert seeds["config"]["min_df"] == 3 and seeds["config"]["top_k"] == 20
    report = (tmp_path / "out" / "seeds_report.md").read_text()
    assert report.count("\n| ") == (2 + 50) + (2 + 4)  # candidates: header + 50; filters: header + 4
    assert "removed: stop word" in report
    assert (tmp_path / "out" / "seeds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_shipped_stop_words_are_sklearns():
    assert SHIPPED_STOP_WORDS == ENGLISH_STOP_WORDS


@pytest.mark.slow
def test_two_workers_give_the_same_statistics(tmp_path: Path, sample_corpus: Path, subprocess_env):
    subset = tmp_path / "subset.jsonl"
    subset.write_text("\n".join(sample_corpus.read_text(encoding="utf-8").splitlines()[:300]) + "\n")
    parts = [tmp_path / f"part-{i}.jsonl" for i in range(3)]  # several files, so both workers read
    lines = subset.read_text().splitlines()
    for i, part in enumerate(parts):
        part.write_text("\n".join(lines[i::3]) + "\n")
    pattern = str(tmp_path / "part-*.jsonl")
    run_cli(["stats", "--input", pattern, "--output", str(tmp_path / "one")], subprocess_env)
    run_cli(["stats", "--input", pattern, "--output", str(tmp_path / "two"),
             "--direct_num_workers=2", "--direct_running_mode=multi_processing"], subprocess_env)
    one, two = read_stats(tmp_path / "one"), read_stats(tmp_path / "two")
    assert one.num_rows > 1000 and one.equals(two)
    texts = [json.loads(line)["text"] for line in lines]
    assert dict(zip(one["word"].to_pylist(), one["tf"].to_pylist(), strict=True)) == Counter(
        w for t in texts for w in words(t))
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two")]
    assert summaries[0]["N"] == summaries[1]["N"] == 300


@pytest.mark.slow
def test_general_corpus_frequencies(tmp_path: Path, subprocess_env):
    domain = tmp_path / "domain.txt"
    domain.write_text("genome genome reads\nthe genome of the cat\n")
    general = tmp_path / "general.txt"
    general.write_text("the cat\nthe dog and the cat\n")
    run_cli(["stats", "--input", str(domain), "--general-input", str(general), "--output", str(tmp_path / "s")],
            subprocess_env)
    rows = {r["word"]: r for r in read_stats(tmp_path / "s").to_pylist()}
    assert rows["the"]["general_frequency"] == 3 / 7 and rows["genome"]["general_frequency"] == 0
    assert rows["genome"]["tf_icf"] == pytest.approx(3 / 8 * math.log(1 / (0.5 / 7)))
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["general"] == {"documents_read": 2, "documents_accepted": 2, "documents_rejected": 0,
                                  "total_words": 7}
    assert summary["general_source"] == "corpus"
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "general_rejects-00000-of-00001.jsonl", "rejects-00000-of-00001.jsonl", "summary.json",
        "word_stats-00000-of-00001.parquet"]
    # A rerun into the same folder replaces the previous run's files, leaving none behind.
    run_cli(["stats", "--input", str(general), "--output", str(tmp_path / "s")], subprocess_env)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "rejects-00000-of-00001.jsonl", "summary.json", "word_stats-00000-of-00001.parquet"]
    assert {r["word"] for r in read_stats(tmp_path / "s").to_pylist()} == {"the", "cat", "dog", "and"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["domain.txt", "general.txt", "s"]  # no staging left


@pytest.mark.slow
def test_bad_inputs_are_rejected_and_counted(tmp_path: Path, subprocess_env):
    (tmp_path / "a.txt").write_bytes(b"good line one\n\xff\xfe broken\n\nanother good line\n")
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "fine"}\n{oops\n{"body": "x"}\n{"text": 5}\n{"text": ""}\n')
    pq.write_table(pa.table({"body": ["no text column"]}), tmp_path / "c.parquet")
    pq.write_table(pa.table({"text": ["parquet row", None]}), tmp_path / "d.parquet")
    out = tmp_path / "stats"
    result = run_cli(["stats", "--input", str(tmp_path / "*.txt"), str(tmp_path / "*.jsonl"),
                      str(tmp_path / "*.parquet"), "--output", str(out)], subprocess_env)
    assert "documents read: 12, accepted: 4, rejected: 8" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["documents_read"], summary["documents_accepted"], summary["documents_rejected"]) == (12, 4, 8)
    rejects = [json.loads(line) for p in out.glob("rejects-*.jsonl") for line in p.read_text().splitlines()]
    got = sorted((Path(r["source"]).name, r["location"], r["reason"].split(":")[0]) for r in rejects)
    assert got == [
        ("a.txt", "line 2", "not UTF-8"),
        ("a.txt", "line 3", "empty document"),
        ("b.jsonl", "line 2", "not JSON"),
        ("b.jsonl", "line 3", "no field 'text'"),
        ("b.jsonl", "line 4", "field 'text' is int, not a string"),
        ("b.jsonl", "line 5", "empty document"),
        ("c.parquet", "file", "no column 'text' (columns"),
        ("d.parquet", "row 2", "column 'text' is null"),
    ]


@pytest.mark.slow
def test_missing_input_fails_and_writes_nothing(tmp_path: Path, sample_corpus: Path, subprocess_env):
    out = tmp_path / "stats"
    result = run_cli(["stats", "--input", str(sample_corpus), str(tmp_path / "nope.jsonl"), "--output", str(out)],
                     subprocess_env, check=False)
    assert result.returncode == 2
    assert "input not found" in result.stderr and "nope.jsonl" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_zero_accepted_fails_and_writes_nothing(tmp_path: Path, subprocess_env):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "bad.jsonl").write_text('{"title": "no text"}\nnot json\n')
    result = run_cli(["stats", "--input", str(corpus / "bad.jsonl"), "--output", str(tmp_path / "stats")],
                     subprocess_env, check=False)
    assert result.returncode == 2
    assert "no document accepted" in result.stderr and "no field 'text'" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["corpus"]


@pytest.mark.slow
def test_seeds_without_stats_fails(tmp_path: Path, subprocess_env):
    result = run_cli(["seeds", "--stats", str(tmp_path), "--output", str(tmp_path / "seeds.json")],
                     subprocess_env, check=False)
    assert result.returncode == 2 and "no word_stats" in result.stderr
    assert list(tmp_path.iterdir()) == []

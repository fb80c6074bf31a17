"""The vocabulary as compact arrays (mask_signal/word_lookup.py), checked against plain dicts,
and the word table's two formats (one file, then shards) read as one."""

from __future__ import annotations

import json
import random
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.mask_signal.words import words as words_of_text
from maskstream.pipelines.dataset.steps import (
    collect_word_scores,
    vocabulary_counts,
    vocabulary_tally,
    word_table_rows,
)
from maskstream.schemas.manifest import Manifest, read_word_table

SAMPLE_WORDS = ["naïve", "straße", "東京", "🙂ok", "zebra", "apple", "Ǆ", "a", "ab", "abc"]


def test_lookup_numbers_words_in_sorted_order_like_a_dict(sample_corpus):
    text = " ".join(json.loads(line)["text"] for line in sample_corpus.read_text(encoding="utf-8").splitlines()[:300])
    vocabulary = sorted(set(words_of_text(text)) | set(SAMPLE_WORDS))
    shuffled = vocabulary[:]
    random.Random(0).shuffle(shuffled)
    lookup = WordLookup.of(pa.array(shuffled, pa.string()))
    expected = {w: i for i, w in enumerate(vocabulary)}  # what the build used before: a dict of the sorted words
    probes = vocabulary + ["not-a-word-of-it", "", "zebras"]
    assert lookup.index_of(probes).tolist() == [expected.get(w, -1) for w in probes]
    assert len(lookup) == len(vocabulary) and lookup.nbytes == 12 * len(vocabulary)


def test_a_word_listed_twice_is_refused():
    with pytest.raises(ValueError, match="same 64-bit hash"):
        WordLookup.of(["alpha", "beta", "alpha"])


def test_scores_fallback_and_word_table_rows():
    words = pa.array(["gamma", "alpha", "delta", "beta"], pa.string())
    lookup = WordLookup.of(words)  # alpha 0, beta 1, delta 2, gamma 3
    encoded = pa.table({"word_index": pa.array([3, 0], pa.int32()), "similarity": pa.array([0.5, 0.25], pa.float32()),
                        "nearest_seed": ["gamma", "alpha"]})
    scores = collect_word_scores([encoded], len(lookup), ["gamma", "alpha"])
    assert scores.similarity.tolist() == [0.25, 0.375, 0.375, 0.5]  # skipped: the mean of the encoded
    assert scores.fallback == 0.375 and scores.encoded.tolist() == [True, False, False, True]
    ((shard, rows),) = list(word_table_rows(words, lookup, scores))
    assert shard == 0
    assert sorted(rows.to_pylist(), key=lambda r: r["word_index"]) == [
        {"word": "alpha", "word_index": 0, "similarity": 0.25, "nearest_seed": "alpha"},
        {"word": "beta", "word_index": 1, "similarity": 0.375, "nearest_seed": ""},
        {"word": "delta", "word_index": 2, "similarity": 0.375, "nearest_seed": ""},
        {"word": "gamma", "word_index": 3, "similarity": 0.5, "nearest_seed": "gamma"}]
    tally = vocabulary_tally(words, np.array([5, 1, 2, 9]), 3, ["alpha"])  # gamma, beta by count; alpha a seed
    assert vocabulary_counts(tally, 3) == {
        "min_word_count": 3, "fallback": "mean similarity of the encoded word types", "word_types": 4,
        "word_types_encoded": 3, "word_types_skipped": 1, "word_occurrences": 17, "word_occurrences_encoded": 15,
        "word_occurrence_coverage": 15 / 17}


def test_both_word_table_formats_read_as_one(tmp_path):
    table = pa.table({"word": ["b", "a", "c"], "word_index": pa.array([1, 0, 2], pa.int32()),
                      "similarity": pa.array([0.1, 0.2, 0.3], pa.float32()), "nearest_seed": ["", "", ""]})
    old = tmp_path / "old"
    old.mkdir()
    pq.write_table(table, old / "words.parquet")
    new = tmp_path / "new" / "words"
    new.mkdir(parents=True)
    pq.write_table(table.slice(0, 2), new / "words-00000-of-00002.parquet")
    pq.write_table(table.slice(2), new / "words-00001-of-00002.parquet")
    legacy = Manifest.from_json(json.dumps({  # a manifest of format 1 names no word table format
        "version": "v0", "created_at": "", "tokenizer": {}, "encoder": {}, "seeds": [], "formulas": {}, "config": {},
        "source_fingerprint": {}, "shards": [], "schema_version": 1}))
    assert (legacy.word_table, legacy.word_table_format) == ("words.parquet", 1)
    for folder, name in ((old, legacy.word_table), (tmp_path / "new", "words")):
        read = read_word_table(str(folder), name)
        assert read.column("word").to_pylist() == ["a", "b", "c"]


@pytest.mark.parametrize("word_types", [1_000_000])
def test_bytes_per_word_type_of_the_lookup(word_types):
    """What a worker holds per word type to look words up: measured, not assumed (issue 28 item 4: <= 40 B)."""
    words = pa.array([f"w{i:07d}" for i in range(word_types)], pa.string())
    tracemalloc.start()
    lookup = WordLookup.of(words)
    scores = collect_word_scores([pa.table({"word_index": pa.array([0], pa.int32()),
                                    "similarity": pa.array([1.0], pa.float32()), "nearest_seed": ["w0000000"]})],
                         len(lookup), ["w0000000"])
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert (lookup.nbytes + scores.nbytes) / word_types == 18
    assert held / word_types <= 40, f"{held / word_types:.1f} bytes a word type"


def test_update_refuses_a_vocabulary_beyond_its_memory(tmp_path, sample_corpus, tiny_bert, monkeypatch, caplog):
    """`update` runs in one process: it checks the vocabulary against the memory available and
    points to `build` on Dataflow instead of running out of memory."""
    from maskstream.cli import main
    from maskstream.pipelines.update import memory

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "part-0.jsonl").write_text("".join(sample_corpus.read_text(encoding="utf-8").splitlines(True)[:40]),
                                         encoding="utf-8")
    monkeypatch.setattr(memory, "available_memory", lambda: 2**30)  # less than the process alone
    code = main(["update", "--input", str(corpus / "*.jsonl"), "--output", str(tmp_path / "dataset"),
                 "--model", tiny_bert, "--encoder-dtype", "float32"])
    assert code == 2
    assert "on Dataflow (--runner=DataflowRunner)" in caplog.text and "word types need" in caplog.text
    assert not (tmp_path / "dataset" / "latest").exists()

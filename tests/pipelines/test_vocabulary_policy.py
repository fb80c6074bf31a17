"""The vocabulary policy (`--min-word-count`): only frequent word types are encoded, the others get
the mean similarity of the encoded types, the coverage is counted right, and the budget stays exact.

The statistics are made with `collections.Counter` (tests/pipelines/test_build.py's `make_inputs`),
so the expected coverage is counted independently of the build."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest

from maskstream.cli import build_parser, main
from maskstream.mask_signal.probability import mask_probabilities_flat
from maskstream.pipelines.dataset.core.vocabulary import SKIPPED
from maskstream.schemas.manifest import load_manifest
from tests.pipelines.test_build import SEEDS, EncoderSpy, build_args, make_inputs, read_rows

DOCUMENTS, MIN_COUNT = 60, 2
OPTIONS = ("--num-shards", "2", "--alpha", "0.9")


def corpus_counts(inputs: dict) -> Counter:
    table = pq.read_table(f"{inputs['stats']}/word_stats-00000-of-00001.parquet")
    return Counter(dict(zip(table.column("word").to_pylist(), table.column("tf").to_pylist(), strict=True)))


@pytest.fixture(scope="module")
def builds(sample_corpus, tmp_path_factory, minilm_path):
    """The same 60 documents built with every word encoded and with --min-word-count 2."""
    folder = tmp_path_factory.mktemp("vocabulary")
    inputs = make_inputs(sample_corpus, folder, DOCUMENTS)
    result = {"inputs": inputs, "counts": corpus_counts(inputs)}
    for name, extra in (("all", ()), ("policy", ("--min-word-count", str(MIN_COUNT)))):
        monkeypatch, spy = pytest.MonkeyPatch(), EncoderSpy()
        spy.install(monkeypatch)
        try:
            assert main(build_args(inputs, str(folder / name), *OPTIONS, *extra)) == 0
        finally:
            monkeypatch.undo()
        url, manifest = load_manifest(str(folder / name))
        result[name] = {"url": url, "manifest": manifest, "spy": spy, "rows": read_rows(url),
                        "words": pq.read_table(f"{url}/{manifest.word_table}")}
    return result


def encoded_by_count(counts: Counter) -> set[str]:
    return {w for w, n in counts.items() if n >= MIN_COUNT} | (set(SEEDS) & counts.keys())


@pytest.mark.slow
def test_coverage_is_counted_right(builds):
    counts = builds["counts"]
    encoded = encoded_by_count(counts)
    vocabulary = builds["policy"]["manifest"].vocabulary
    assert 0 < len(encoded) < len(counts)
    assert vocabulary["min_word_count"] == MIN_COUNT
    assert (vocabulary["word_types"], vocabulary["word_types_encoded"], vocabulary["word_types_skipped"]) == (
        len(counts), len(encoded), len(counts) - len(encoded))
    assert vocabulary["word_occurrences"] == sum(counts.values())
    assert vocabulary["word_occurrences_encoded"] == sum(counts[w] for w in encoded)
    # Tokens: every non-special token of a word in the shards, by the word the word table names.
    rows = builds["policy"]["rows"]
    words = builds["policy"]["words"].column("word").to_pylist()
    index = rows.column("word_index").combine_chunks().flatten().to_numpy()
    special = rows.column("special_tokens_mask").combine_chunks().flatten().to_numpy()
    in_words = index[(special == 0) & (index >= 0)]
    tokens = Counter(words[i] for i in in_words.tolist())
    assert vocabulary["tokens_in_words"] == len(in_words)
    assert vocabulary["tokens_encoded"] == sum(n for w, n in tokens.items() if w in encoded)
    assert vocabulary["token_coverage"] == pytest.approx(vocabulary["tokens_encoded"] / len(in_words))
    everything = builds["all"]["manifest"].vocabulary
    assert everything["word_types_skipped"] == 0 and everything["token_coverage"] == 1.0
    assert everything["fallback_similarity"] is None


@pytest.mark.slow
def test_the_encoder_sees_only_the_encoded_words(builds, minilm_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    expected = encoded_by_count(builds["counts"]) | set(SEEDS)
    seen = [tokenizer.decode(row, skip_special_tokens=True).replace(" ", "") for row in builds["policy"]["spy"].rows]
    assert Counter(seen) == Counter(tokenizer.decode(tokenizer(w, add_special_tokens=False)["input_ids"]).replace(" ", "")
                                    for w in expected)
    assert len(builds["all"]["spy"].rows) > len(seen)


@pytest.mark.slow
def test_skipped_words_get_the_mean_similarity_of_the_encoded_ones(builds):
    counts, encoded = builds["counts"], encoded_by_count(builds["counts"])
    policy, everything = builds["policy"]["words"].to_pylist(), builds["all"]["words"].to_pylist()
    assert [r["word"] for r in policy] == [r["word"] for r in everything] == sorted(counts)  # word_index unchanged
    skipped = [r for r in policy if r["nearest_seed"] == SKIPPED]
    assert {r["word"] for r in skipped} == counts.keys() - encoded
    # An encoded word scores as it does when every word is encoded.
    kept = [(r["similarity"], a["similarity"]) for r, a in zip(policy, everything, strict=True)
            if r["nearest_seed"] != SKIPPED]
    assert all(x == y for x, y in kept)
    fallback = np.float32(np.mean([x for x, _ in kept], dtype=np.float64))
    assert all(r["similarity"] == fallback for r in skipped)
    assert builds["policy"]["manifest"].vocabulary["fallback_similarity"] == pytest.approx(float(fallback))

    # The stored probabilities are the map's for those similarities, recomputed here.
    rows = builds["policy"]["rows"]
    similarity = np.array([r["similarity"] for r in policy], np.float32)
    offsets = rows.column("word_ids").combine_chunks().offsets.to_numpy().astype(np.int64)

    def flat(name):
        return rows.column(name).combine_chunks().flatten().to_numpy()

    config = builds["policy"]["manifest"].config
    expected = mask_probabilities_flat(flat("word_ids"), flat("word_index"), flat("special_tokens_mask"), offsets,
                                       similarity, budget=config["budget"], alpha=config["alpha"],
                                       weighting=config["weighting"], width=config["max_length"])
    assert np.array_equal(flat("mask_probability"), expected)
    # A sequence without a skipped word is the same row as in the build that encodes everything.
    skipped_index = np.array([r["word_index"] for r in skipped])
    for p, q, index in zip(rows.column("mask_probability").to_pylist(),
                           builds["all"]["rows"].column("mask_probability").to_pylist(),
                           rows.column("word_index").to_pylist(), strict=True):
        if not np.isin(index, skipped_index).any():
            assert p == q


@pytest.mark.slow
def test_the_budget_stays_exact(builds):
    rows, budget = builds["policy"]["rows"], builds["policy"]["manifest"].config["budget"]
    for p, special in zip(rows.column("mask_probability").to_pylist(), rows.column("special_tokens_mask").to_pylist(),
                          strict=True):
        p, special = np.array(p, np.float64), np.array(special)
        assert np.all(p[special == 1] == 0) and np.all((p >= 0) & (p <= 1))
        assert p.sum() == pytest.approx(budget * (special == 0).sum(), rel=1e-5)


def test_a_threshold_below_one_is_refused(minilm_path):
    from maskstream.cli.build import build_config

    args, _ = build_parser().parse_known_args(["build", "--input", "x", "--stats", "s", "--seeds", "s.json",
                                               "--output", "o", "--min-word-count", "0"])
    with pytest.raises(ValueError, match="--min-word-count must be >= 1"):
        build_config(args)


def test_seeds_are_always_encoded_and_a_threshold_leaving_no_word_is_refused():
    import pyarrow as pa

    from maskstream.pipelines.dataset.core.vocabulary import encoded_words

    words = pa.array(["alpha", "beta", "gamma"])
    assert encoded_words(words, [1, 2, 1], 2, ["gamma", "delta"]) == ["beta", "gamma"]
    with pytest.raises(ValueError, match="leaves no word type to encode"):
        encoded_words(words[:2], [1, 2], 3, ["delta"])

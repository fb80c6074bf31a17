"""The peers' signals (issue 52): PMI-Masking's collocations and InforMask's informative relevance,
checked against independent computations on the shipped corpus, and `maskstream build --peer-signals`
against the in-process form of the same formulas."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from maskstream.cli import main
from maskstream.mask_signal.peer_lookup import PeerSignals, PeerSignalsMissing
from maskstream.mask_signal.words import words
from maskstream.pipelines.corpus import Document
from maskstream.pipelines.dataset.beam.peer_transforms import CountPeers, InformativeRelevance
from maskstream.pipelines.statistics.peer_formulas import (
    PeerSignalSettings,
    collocation_vocabulary,
    cuts,
    informative_relevance,
    mask_weights,
    ngram_counts,
    ngram_totals,
    pmi_n,
)
from maskstream.schemas.manifest import load_manifest, read_word_table
from maskstream.schemas.tables import COLLOCATION_SCHEMA, INFORMATIVENESS_SCHEMA, check_schema
from tests.pipelines.test_build import build_args, make_inputs


@pytest.fixture(scope="module")
def texts(sample_corpus: Path) -> list[str]:
    with open(sample_corpus, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def independent_sentences(text: str) -> list[list[str]]:
    """Sentences by re.split on the documented rule, words by the word regex: not the code under test."""
    pieces = re.split(r"(?<=[.!?])(?=\s)|(?<=[.!?])$|\n", text)
    return [found for piece in pieces if (found := words(piece))]


def independent_phrases(text: str) -> list[list[str]]:
    """Phrases by re.split at every character that is neither a word character nor white space (or is a
    line break or `_`), words by the word regex: not the code under test."""
    return [found for piece in re.split(r"[^\w\s]|_|\n", text) if (found := words(piece))]


def independent_ngram_counts(texts: list[str]) -> Counter:
    counts: Counter = Counter()
    for text in texts:
        for phrase in independent_phrases(text):
            for n in range(1, 6):
                counts.update(zip(*(phrase[i:] for i in range(n)), strict=False))
    return counts


def test_ngram_counts_equal_an_independent_count_of_the_shipped_corpus(texts):
    assert ngram_counts(texts) == independent_ngram_counts(texts)


@pytest.mark.slow
def test_beam_counts_equal_the_independent_counts(texts):
    sample = texts[:60]
    expected = list(independent_ngram_counts(sample).items())
    sentence_sets = [sorted(set(s)) for t in sample for s in independent_sentences(t)]
    with BeamTestPipeline() as pipeline:
        documents = pipeline | beam.Create([Document(f"corpus:line {i}", "corpus", t) for i, t in enumerate(sample)])
        counted = documents | CountPeers()
        assert_that(counted["ngrams"], equal_to(expected), label="Ngrams")
        assert_that(counted["totals"], equal_to(list(ngram_totals(expected).items())), label="Totals")
        assert_that(counted["words"], equal_to(list(Counter(w for s in sentence_sets for w in s).items())),
                    label="Words")
        assert_that(counted["pairs"], equal_to(list(Counter(
            p for s in sentence_sets for p in itertools.combinations(s, 2)).items())), label="Pairs")
        assert_that(counted["sentences"], equal_to([len(sentence_sets)]), label="Sentences")


def test_pmi_n_is_the_least_pmi_over_the_cuts():
    counts = Counter({("a",): 8, ("b",): 4, ("c",): 2, ("a", "b"): 3, ("b", "c"): 2, ("a", "b", "c"): 2})
    totals = {1: 14, 2: 10, 3: 5}
    p = {g: c / totals[len(g)] for g, c in counts.items()}
    bigram = math.log(p[("a", "b")] / (p[("a",)] * p[("b",)]))
    assert pmi_n(("a", "b"), counts, totals) == pytest.approx(bigram)
    by_cut = [math.log(p[("a", "b", "c")] / (p[("a",)] * p[("b", "c")])),
              math.log(p[("a", "b", "c")] / (p[("a", "b")] * p[("c",)])),
              math.log(p[("a", "b", "c")] / (p[("a",)] * p[("b",)] * p[("c",)]))]
    assert pmi_n(("a", "b", "c"), counts, totals) == pytest.approx(min(by_cut))
    assert [len(cuts(n)) for n in range(2, 6)] == [1, 3, 7, 15]


def test_textbook_collocations_rank_above_function_word_pairs(texts):
    counts = ngram_counts(texts)
    totals = ngram_totals(counts.items())
    collocations = ["command line", "open source", "machine learning", "molecular dynamics", "finite element"]
    function_pairs = ["of the", "for the", "in the", "and the"]
    score = {g: pmi_n(tuple(g.split()), counts, totals) for g in collocations + function_pairs}
    assert min(score[g] for g in collocations) > max(score[g] for g in function_pairs) + 2, score
    vocabulary = {" ".join(g) for g, _, _ in collocation_vocabulary(counts, PeerSignalSettings())}
    assert set(collocations) <= vocabulary
    assert "and the" not in vocabulary  # PMI below 0


def direct_relevance(texts: list[str], pair_min_count: int) -> dict[str, float]:
    """InforMask's relevance straight from its definition: per sentence, a word's summed PMI with the
    sentence's other words; averaged over the word's sentences. Sentences: the independent split."""
    sentence_sets = [sorted(set(s)) for text in texts for s in independent_sentences(text)]
    holding = Counter(w for s in sentence_sets for w in s)
    together = Counter(pair for s in sentence_sets for pair in itertools.combinations(s, 2))
    total = len(sentence_sets)

    def pmi(a: str, b: str) -> float:
        c = together[tuple(sorted((a, b)))]
        return math.log(c * total / (holding[a] * holding[b])) if c >= pair_min_count else 0.0

    sums: dict[str, list[float]] = {}
    for s in sentence_sets:
        for w in s:
            sums.setdefault(w, []).append(sum(pmi(w, other) for other in s if other != w))
    return {w: sum(values) / len(values) for w, values in sums.items()}


def test_relevance_equals_the_direct_computation_on_a_handful_of_sentences(texts):
    sample = texts[:12]  # every sentence of these is below the 64-word cap
    settings = PeerSignalSettings(pair_min_count=2)
    sentence_counts, relevance, total = informative_relevance(sample, settings)
    direct = direct_relevance(sample, 2)
    assert relevance.keys() == direct.keys()
    for word, value in direct.items():
        assert relevance[word] == pytest.approx(value, rel=1e-12, abs=1e-12), word
    assert total == sum(len(independent_sentences(t)) for t in sample)
    assert any(value > 0 for value in relevance.values())


@pytest.mark.slow
def test_beam_relevance_equals_the_in_process_form(texts):
    sample = texts[:80]
    settings = PeerSignalSettings(pair_min_count=2)
    sentence_counts, relevance, total = informative_relevance(sample, settings)
    expected = [(w, sentence_counts[w], relevance[w]) for w in relevance]
    with BeamTestPipeline() as pipeline:
        documents = pipeline | beam.Create([Document(f"c:line {i}", "c", t) for i, t in enumerate(sample)])
        counted = documents | CountPeers()
        assert_that(counted | InformativeRelevance(settings), equal_to(expected), label="Relevance")
        assert_that(counted["sentences"], equal_to([total]), label="Sentences")


def test_mask_weights_are_average_ranks():
    weights = mask_weights(np.array([0.5, -1.0, 0.5, 3.0]))
    assert weights.tolist() == [0.625, 0.25, 0.625, 1.0]


@pytest.fixture(scope="module")
def peer_build(sample_corpus, tmp_path_factory, tiny_encoder):
    """A build of 400 documents with the peers' signals. The tiny encoder (MiniLM's tokenizer) encodes the
    words: the peers' tables count words, and none of this module's checks reads an embedding."""
    folder = tmp_path_factory.mktemp("peer-build")
    inputs = make_inputs(sample_corpus, folder, 400)
    root = str(folder / "dataset")
    assert main(build_args(inputs, root, "--peer-signals", "--ngram-min-count", "3", "--max-collocations", "500",
                           "--model", tiny_encoder)) == 0
    version_url, manifest = load_manifest(root)
    with open(inputs["corpus"], encoding="utf-8") as f:
        corpus = [json.loads(line)["text"] for line in f]
    return {"version_url": version_url, "manifest": manifest, "texts": corpus, "inputs": inputs, "folder": folder}


@pytest.mark.slow
def test_the_build_writes_what_the_in_process_form_computes(peer_build):
    version_url, manifest, corpus = peer_build["version_url"], peer_build["manifest"], peer_build["texts"]
    settings = PeerSignalSettings(ngram_min_count=3, max_collocations=500)
    entry = manifest.peer_signals
    assert entry["settings"]["ngram_min_count"] == 3 and entry["formulas"]["collocations"] == "pmi-ngram-v2"
    collocations = pq.read_table(f"{version_url}/{entry['collocations']}")
    check_schema(collocations.schema, COLLOCATION_SCHEMA, "collocations")
    expected = collocation_vocabulary(ngram_counts(corpus), settings)
    assert len(expected) == 500 == entry["collocation_count"]
    assert collocations.column("ngram").to_pylist() == [" ".join(g) for g, _, _ in expected]
    assert collocations.column("pmi").to_pylist() == [p for _, _, p in expected]
    assert collocations.column("count").to_pylist() == [c for _, c, _ in expected]
    words_of = read_word_table(version_url, manifest.word_table, columns=["word"]).column("word").to_pylist()
    assert [" ".join(words_of[i] for i in row) for row in collocations.column("word_index").to_pylist()] == \
        collocations.column("ngram").to_pylist()

    table = pq.read_table(f"{version_url}/{entry['informativeness']}")
    check_schema(table.schema, INFORMATIVENESS_SCHEMA, "informativeness")
    sentence_counts, relevance, total = informative_relevance(corpus, settings)
    assert entry["sentences"] == total
    assert table.column("word_index").to_pylist() == list(range(len(words_of)))
    assert table.column("relevance").to_pylist() == [relevance.get(w, 0.0) for w in words_of]
    assert table.column("sentences").to_pylist() == [sentence_counts.get(w, 0) for w in words_of]


@pytest.mark.slow
def test_a_build_without_peer_signals_names_the_flag(sample_corpus, tmp_path, tiny_encoder):
    inputs = make_inputs(sample_corpus, tmp_path, 30)
    assert main(build_args(inputs, str(tmp_path / "dataset"), "--model", tiny_encoder)) == 0
    version_url, manifest = load_manifest(str(tmp_path / "dataset"))
    assert manifest.peer_signals == {}
    assert "peer_signals" not in json.loads(Path(version_url, "manifest.json").read_text())
    with pytest.raises(PeerSignalsMissing, match="--peer-signals"):
        PeerSignals.load(version_url, manifest)


@pytest.mark.slow
def test_span_ids_join_the_words_of_each_collocation_found(peer_build):
    version_url, manifest = peer_build["version_url"], peer_build["manifest"]
    signals = PeerSignals.load(version_url, manifest)
    words_of = read_word_table(version_url, manifest.word_table, columns=["word"]).column("word").to_pylist()
    vocabulary = set(pq.read_table(f"{version_url}/collocations.parquet").column("ngram").to_pylist())
    rows = pq.read_table(f"{version_url}/{manifest.shards[0].path}").to_pylist()
    multiword = 0
    for row in rows:
        span_ids = signals.span_ids(row["word_ids"], row["word_index"])
        word_ids = np.array(row["word_ids"])
        assert np.array_equal(span_ids < 0, word_ids < 0)
        # a unit is whole words: tokens of one word share its unit
        for word in np.unique(word_ids[word_ids >= 0]):
            assert len(np.unique(span_ids[word_ids == word])) == 1
        units: dict[int, list[tuple[int, int]]] = {}
        for w, i, s in zip(row["word_ids"], row["word_index"], span_ids.tolist(), strict=True):
            if w >= 0 and i >= 0 and (w, i) not in units.setdefault(s, []):
                units[s].append((w, i))
        for members in units.values():
            if len(members) > 1:
                multiword += 1
                assert 2 <= len(members) <= 5
                assert " ".join(words_of[i] for _, i in members) in vocabulary
        # numbered 0, 1, 2, ... in order of first token, like word_ids
        first = [s for k, s in enumerate(span_ids.tolist()) if s >= 0 and s not in span_ids[:k]]
        assert first == list(range(len(first)))
    assert multiword > 0


@pytest.mark.slow
def test_inspect_shows_the_collocations_found_and_the_informative_words(peer_build, tmp_path, capsys):
    page = tmp_path / "page.html"
    assert main(["inspect", str(peer_build["version_url"]), "--samples", "0", "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "peer signals     500 collocations" in out
    top = pq.read_table(f"{peer_build['version_url']}/collocations.parquet").column("ngram")[0].as_py()
    assert f"top collocations (PMI, count): {top} (" in out
    found = out.split("most found: ")[1].splitlines()[0]
    assert found.count(";") >= 5  # collocations the sequences hold, by how often
    assert "most informative words" in out and "least informative words" in out
    html = page.read_text(encoding="utf-8")
    assert 'id="peers-section"' in html and top in html and "Peer signals" in html


@pytest.mark.slow
def test_inspect_of_a_version_without_them_says_how_to_get_them(tmp_path, sample_corpus, capsys, tiny_encoder):
    inputs = make_inputs(sample_corpus, tmp_path, 20)
    assert main(build_args(inputs, str(tmp_path / "dataset"), "--model", tiny_encoder)) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "dataset"), "--samples", "0", "--html", str(tmp_path / "p.html")]) == 0
    assert "peer signals     none (build with --peer-signals" in capsys.readouterr().out
    assert 'id="peers-section"' not in (tmp_path / "p.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_loader_joins_the_signals_to_every_row(peer_build):
    from maskstream.trainer.dataset import StreamingSequenceDataset

    version_url, manifest = peer_build["version_url"], peer_build["manifest"]
    signals = PeerSignals.load(version_url, manifest)
    dataset = StreamingSequenceDataset(version_url, seed=3, peer_columns=("span_ids", "informativeness"))
    samples = list(dataset)
    assert len(samples) == manifest.total_rows
    for sample in samples:
        assert sample["span_ids"].tolist() == signals.span_ids(sample["word_ids"], sample["word_index"]).tolist()
        assert sample["informativeness"].tolist() == signals.token_weights(sample["word_index"]).tolist()
    plain = next(iter(StreamingSequenceDataset(version_url, seed=3)))
    assert "span_ids" not in plain and "informativeness" not in plain
    informask = next(iter(StreamingSequenceDataset(version_url, seed=3, peer_columns=("informativeness",))))
    assert "informativeness" in informask and "span_ids" not in informask  # only what the strategy reads


@pytest.mark.slow
def test_train_with_pmi_span_resumes_exactly(peer_build, tiny_bert, tmp_path):
    """`maskstream train --strategy pmi_span` (held-out loss with informask) on a --peer-signals version: a
    resume from step 3 of 6 gives the uninterrupted run's losses exactly (masks are f(seed, epoch, row))."""
    import shutil

    from tests.trainer.test_train import _train, _train_losses

    args = ["--strategy", "pmi_span", "--eval-strategy", "informask", "--batch-size", "5", "--max-steps", "6",
            "--save-every", "3", "--num-workers", "2", "--eval-samples", "10", "--eval-every", "6"]
    dataset = str(peer_build["version_url"])
    _train(dataset, tmp_path / "straight", tiny_bert, *args)
    expected = _train_losses(tmp_path / "straight")
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight" / "checkpoints" / "step-00000003", resumed / "checkpoints" / "step-00000003")
    (resumed / "checkpoints" / "latest").write_text("step-00000003\n")
    _train(dataset, resumed, tiny_bert, *args, "--resume")
    losses = _train_losses(resumed)
    assert sorted(losses) == [4, 5, 6] and [losses[s] for s in (4, 5, 6)] == [expected[s] for s in (4, 5, 6)]

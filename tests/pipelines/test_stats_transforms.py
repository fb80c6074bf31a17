"""The counting and TF-ICF composite transforms, with TestPipeline and assert_that."""

from __future__ import annotations

import math
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from wordfreq import word_frequency

from pipelines.corpus import Document
from pipelines.statistics.counting import CountWords
from pipelines.statistics.tf_icf import TfIcf, corpus_floor, tf_icf, wordfreq_floor
from schemas.words import words

DOMAIN = [
    "Genome assembly: the genome, assembled.",
    "GENOME alignment of reads",
    "Ｆｕｌｌｗｉｄｔｈ reads and qiimeish reads",
]
GENERAL = ["the cat sat on the mat", "reads the genome news"]


def documents(texts: list[str], source: str) -> list[Document]:
    return [Document(f"{source}:line {i}", source, text) for i, text in enumerate(texts, start=1)]


def expected_counts(texts: list[str]) -> dict[str, tuple[int, int]]:
    tf = Counter(w for t in texts for w in words(t))
    df = Counter(w for t in texts for w in set(words(t)))
    return {w: (tf[w], df[w]) for w in tf}


def test_count_words():
    with TestPipeline() as p:
        counted = p | beam.Create(documents(DOMAIN, "d")) | CountWords()
        assert_that(counted["counts"], equal_to(list(expected_counts(DOMAIN).items())), label="Counts")
        assert_that(counted["documents"], equal_to([3]), label="N")
        assert_that(counted["words"], equal_to([sum(len(words(t)) for t in DOMAIN)]), label="TotalWords")
    assert expected_counts(DOMAIN)["genome"] == (3, 2)
    assert expected_counts(DOMAIN)["fullwidth"] == (1, 1)  # NFKC folded the full-width letters


def test_tf_icf_with_wordfreq():
    counts = expected_counts(DOMAIN)
    total = sum(tf for tf, _ in counts.values())
    floor = wordfreq_floor(0.5)
    expected = []
    for word, (tf, df) in counts.items():
        f_g = word_frequency(word, "en")
        expected.append({"word": word, "tf": tf, "df": df, "general_frequency": f_g,
                         "tf_icf": (tf / total) * math.log(1 / max(f_g, floor))})
    assert any(row["general_frequency"] == 0 for row in expected)  # 'qiimeish' exercises the floor
    with TestPipeline() as p:
        rows = p | beam.Create(documents(DOMAIN, "d")) | CountWords() | TfIcf(unseen_count=0.5)
        assert_that(rows, equal_to(expected))


def test_tf_icf_with_general_corpus():
    counts = expected_counts(DOMAIN)
    total = sum(tf for tf, _ in counts.values())
    general_tf = Counter(w for t in GENERAL for w in words(t))
    general_total = sum(general_tf.values())
    floor = 0.5 / general_total
    expected = [
        {"word": w, "tf": tf, "df": df, "general_frequency": general_tf[w] / general_total,
         "tf_icf": (tf / total) * math.log(1 / max(general_tf[w] / general_total, floor))}
        for w, (tf, df) in counts.items()
    ]
    with TestPipeline() as p:
        general = p | "General" >> beam.Create(documents(GENERAL, "g")) | "CountGeneral" >> CountWords()
        rows = p | "Domain" >> beam.Create(documents(DOMAIN, "d")) | CountWords() | TfIcf(general, unseen_count=0.5)
        assert_that(rows, equal_to(expected))
    by_word = {row["word"]: row for row in expected}
    assert by_word["the"]["general_frequency"] == 3 / 10 and by_word["assembly"]["general_frequency"] == 0


def test_formula_and_floors():
    assert tf_icf(10, 100, 1e-4, 5e-9) == pytest.approx(0.1 * math.log(1e4))
    assert tf_icf(10, 100, 0.0, 5e-9) == pytest.approx(0.1 * math.log(2e8))
    assert wordfreq_floor() == pytest.approx(5e-9)
    assert corpus_floor(1000) == pytest.approx(5e-4)

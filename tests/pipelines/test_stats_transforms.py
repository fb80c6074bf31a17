"""The counting and TF-ICF composite transforms, with TestPipeline and assert_that."""

from __future__ import annotations

import json
import math
import unicodedata
from collections import Counter
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from wordfreq import word_frequency

from maskstream.mask_signal.words import words
from maskstream.pipelines.corpus import Document
from maskstream.pipelines.statistics import stats_transforms
from maskstream.pipelines.statistics.counting import word_counts_of_texts
from maskstream.pipelines.statistics.stats_transforms import CountWords, TfIcf
from maskstream.pipelines.statistics.tf_icf import corpus_floor, tf_icf, wordfreq_floor

DOMAIN = [
    "Genome assembly: the genome, assembled.",
    "GENOME alignment of reads",
    "Ｆｕｌｌｗｉｄｔｈ reads and qiimeish reads",
]
GENERAL = ["the cat sat on the mat", "reads the genome news"]
# Where counting over a batch could part from counting word by word: accents precomposed and not,
# CJK, emoji, mixed scripts, characters NFKC changes (ligatures, full-width letters, '½' whose NFKC
# '1⁄2' holds a non-word character, superscripts, circled digits, Hangul jamo), case mappings that
# change length or depend on context (Turkish dotted I, German ß, Greek final sigma), underscores,
# a lone surrogate (a JSON reader lets one through), texts without words and empty ones.
MULTILINGUAL = [
    "Café CAFÉ cafe\u0301 naïve Ångström Ａｎｇｓｔｒöｍ",
    "数据 処理 データ処理 한국어 \u1100\u1161 テスト ｶﾀｶﾅ",
    "emoji 🧬🧪 DNA🧬sequencing 👩‍🔬 ok_go snake_case",
    "ﬁnance ﬂow ﬃ Ⅻ ½ x² H₂O ① ㎏ ℌ",
    "İSTANBUL istanbul ıi Iı STRASSE Straße ẞ",
    "ΟΔΟΣ Σίσυφος σοφός Москва МОСКВА עברית العربية हिन्दी",
    "lone \ud800 surrogate", "", "... !!! ---", "1,000 3.14 2024-01-01",
]


def expected_counts_of(texts: list[str]) -> dict[str, tuple[int, int]]:
    """tf and df with collections.Counter, one text and one word at a time."""
    tf: Counter[str] = Counter()
    df: Counter[str] = Counter()
    for text in texts:
        text_words = words(text)
        tf.update(text_words)
        df.update(set(text_words))
    return {w: (tf[w], df[w]) for w in tf}


def documents(texts: list[str], source: str) -> list[Document]:
    return [Document(f"{source}:line {i}", source, text) for i, text in enumerate(texts, start=1)]


def expected_counts(texts: list[str]) -> dict[str, tuple[int, int]]:
    tf = Counter(w for t in texts for w in words(t))
    df = Counter(w for t in texts for w in set(words(t)))
    return {w: (tf[w], df[w]) for w in tf}


@pytest.mark.slow
def test_count_words():
    with TestPipeline() as p:
        counted = p | beam.Create(documents(DOMAIN, "d")) | CountWords()
        assert_that(counted["counts"], equal_to(list(expected_counts(DOMAIN).items())), label="Counts")
        assert_that(counted["documents"], equal_to([3]), label="N")
        assert_that(counted["words"], equal_to([sum(len(words(t)) for t in DOMAIN)]), label="TotalWords")
    assert expected_counts(DOMAIN)["genome"] == (3, 2)
    assert expected_counts(DOMAIN)["fullwidth"] == (1, 1)  # NFKC folded the full-width letters


def test_batch_counts_equal_counter_on_a_multilingual_sample():
    counted = dict(word_counts_of_texts(MULTILINGUAL))
    assert counted == expected_counts_of(MULTILINGUAL)
    # The sample does reach the cases it is there for.
    assert {"1⁄2", "fi" + "nance", "angström", "i̇stanbul", "straße", "ß", "οδος", "数据", "dna", "ok"} <= counted.keys()
    assert counted["café"] == (2, 1) and counted["strasse"] == (1, 1)  # the combining accent ends "cafe"
    assert dict(word_counts_of_texts(["", "--"])) == {} and dict(word_counts_of_texts([])) == {}


def test_batch_counts_equal_counter_on_the_shipped_corpus(sample_corpus: Path):
    texts = [json.loads(line)["text"] for line in sample_corpus.read_text(encoding="utf-8").splitlines()]
    assert dict(word_counts_of_texts(texts)) == expected_counts_of(texts)


def test_batch_counts_equal_counter_on_every_code_point():
    every = "".join(map(chr, range(0x110000)))
    # Each character alone and after a letter, so both word starts and word continuations are met.
    texts = [every, "".join("a" + c for c in every), unicodedata.normalize("NFKD", every)]
    assert dict(word_counts_of_texts(texts)) == expected_counts_of(texts)


@pytest.mark.slow
def test_count_words_over_several_batches(monkeypatch):
    monkeypatch.setattr(stats_transforms, "BATCH_CHARACTERS", 40)  # a few texts a batch
    texts = MULTILINGUAL * 3 + DOMAIN
    with TestPipeline() as p:
        counted = p | beam.Create(documents(texts, "m")) | CountWords()
        assert_that(counted["counts"], equal_to(list(expected_counts_of(texts).items())), label="Counts")
        assert_that(counted["words"], equal_to([sum(len(words(t)) for t in texts)]), label="TotalWords")
        assert_that(counted["documents"], equal_to([len(texts)]), label="N")


@pytest.mark.slow
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


@pytest.mark.slow
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

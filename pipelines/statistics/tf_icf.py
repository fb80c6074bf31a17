"""TF-ICF per word: frequent in the domain corpus, rare in general text.

    tf_icf(w) = (tf_D(w) / sum_v tf_D(v)) * log(1 / max(f_G(w), floor))

`f_G(w)` is the word's relative frequency in general text: from the `wordfreq` tables
(`word_frequency(w, language)`, offline), or from a second corpus counted by the same
transforms (`tf_G(w) / sum_v tf_G(v)`). A word general text lacks has `f_G = 0`, and would
get an infinite score; it is scored as if it occurred `unseen_count` times (default 0.5) at
the general source's resolution instead:

- wordfreq: `floor = unseen_count * 1e-8` (its English list stops at 1e-8, so an unseen word
  is taken to be half as frequent as the rarest listed one: `floor = 5e-9`);
- a general corpus of `T` words: `floor = unseen_count / T` (half an occurrence).

`general_frequency` is stored unfloored (0 for unseen words), so readers can tell them apart.

With a background corpus (`BackgroundContrast`, counted by the same transforms), each word also
gets its background frequency `f_B(w) = tf_B(w) / T_B` (stored unfloored) and

    contrast(w) = tf_icf(w) * max(0, log(p_D(w) / max(f_B(w), unseen_count / T_B)))

with `p_D(w) = tf_D(w) / sum_v tf_D(v)`: TF-ICF times the word's log-lift over the background,
0 for words the domain uses no more than its background does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.pvalue import AsSingleton

from schemas.formulas import TF_ICF_UNSEEN_COUNT as DEFAULT_UNSEEN_COUNT
from schemas.formulas import WORDFREQ_RESOLUTION


def tf_icf(tf: int, total_words: int, general_frequency: float, floor: float) -> float:
    """The score of a word with `tf` occurrences among `total_words`; see the module docstring."""
    return (tf / total_words) * math.log(1.0 / max(general_frequency, floor))


def wordfreq_floor(unseen_count: float = DEFAULT_UNSEEN_COUNT) -> float:
    return unseen_count * WORDFREQ_RESOLUTION


def corpus_floor(general_total_words: int, unseen_count: float = DEFAULT_UNSEEN_COUNT) -> float:
    # max(..., 1): an empty general corpus is reported by the caller, not as a division by zero here.
    return unseen_count / max(general_total_words, 1)


class WordfreqFrequencyFn(beam.DoFn):
    """(word, (tf, df)) -> (word, (tf, df), f_G) with f_G from the wordfreq tables."""

    def __init__(self, language: str = "en"):
        self.language = language

    def setup(self) -> None:
        from wordfreq import word_frequency

        self.word_frequency = word_frequency

    def process(self, element: tuple[str, tuple[int, int]]) -> Iterator[tuple[str, tuple[int, int], float]]:
        word, counts = element
        yield word, counts, self.word_frequency(word, self.language)


def join_general_counts(
    element: tuple[str, dict[str, list]], general_total_words: int
) -> Iterator[tuple[str, tuple[int, int], float]]:
    """(word, {"domain": [(tf, df)], "general": [(tf, df)]}) -> (word, (tf, df), f_G), domain words only."""
    word, grouped = element
    for counts in grouped["domain"]:
        general = grouped["general"]
        general_tf = general[0][0] if general else 0
        yield word, counts, general_tf / max(general_total_words, 1)


def word_stats_row(
    element: tuple[str, tuple[int, int], float], total_words: int, floor: float
) -> dict[str, Any]:
    """A row of schemas.tables.WORD_STATS_SCHEMA."""
    word, (tf, df), general_frequency = element
    return {
        "word": word,
        "tf": tf,
        "df": df,
        "general_frequency": general_frequency,
        "tf_icf": tf_icf(tf, total_words, general_frequency, floor),
    }


def background_contrast(tf_icf_score: float, domain_frequency: float, background_frequency: float,
                        floor: float) -> float:
    """TF-ICF times the log-lift of the domain over the background (see the module docstring)."""
    return tf_icf_score * max(0.0, math.log(domain_frequency / max(background_frequency, floor)))


def join_background_counts(element: tuple[str, dict[str, list]], total_words: int, background_total_words: int,
                           floor: float) -> Iterator[dict[str, Any]]:
    """(word, {"domain": [row], "background": [(tf, df)]}) -> the row with `background_frequency`
    and `contrast`, domain words only."""
    word, grouped = element
    background = grouped["background"]
    background_frequency = background[0][0] / max(background_total_words, 1) if background else 0.0
    for row in grouped["domain"]:
        yield {**row, "background_frequency": background_frequency,
               "contrast": background_contrast(row["tf_icf"], row["tf"] / total_words, background_frequency, floor)}


class BackgroundContrast(beam.PTransform):
    """Rows of `TfIcf` -> the same rows with `background_frequency` and `contrast`
    (schemas.tables.WORD_STATS_BACKGROUND_SCHEMA).

    `background`: the background corpus's `CountWords` output; `domain_words`: the domain's
    total word count (singleton PCollection).
    """

    def __init__(self, background: dict[str, beam.PCollection], domain_words: beam.PCollection,
                 unseen_count: float = DEFAULT_UNSEEN_COUNT):
        super().__init__()
        self.background = background
        self.domain_words = domain_words
        self.unseen_count = unseen_count

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        floor = self.background["words"] | "BackgroundFloor" >> beam.Map(corpus_floor, self.unseen_count)
        return (
            {"domain": rows | "KeyByWord" >> beam.Map(lambda row: (row["word"], row)),
             "background": self.background["counts"]}
            | "GroupWithBackground" >> beam.CoGroupByKey()
            | "Contrast" >> beam.FlatMap(join_background_counts, AsSingleton(self.domain_words),
                                         AsSingleton(self.background["words"]), AsSingleton(floor))
        )


class TfIcf(beam.PTransform):
    """The domain's `CountWords` output -> PCollection of WORD_STATS_SCHEMA rows (dicts).

    `general`: a general corpus's `CountWords` output, or None for the wordfreq tables.
    """

    def __init__(
        self,
        general: dict[str, beam.PCollection] | None = None,
        language: str = "en",
        unseen_count: float = DEFAULT_UNSEEN_COUNT,
    ):
        super().__init__()
        self.general = general
        self.language = language
        self.unseen_count = unseen_count

    def expand(self, domain: dict[str, beam.PCollection]) -> beam.PCollection:
        pipeline = domain["counts"].pipeline
        unseen_count = self.unseen_count
        if self.general is None:
            with_general = domain["counts"] | "WordfreqFrequency" >> beam.ParDo(WordfreqFrequencyFn(self.language))
            floor = pipeline | "WordfreqFloor" >> beam.Create([wordfreq_floor(unseen_count)])
        else:
            general_words = AsSingleton(self.general["words"])
            with_general = (
                {"domain": domain["counts"], "general": self.general["counts"]}
                | "GroupWithGeneral" >> beam.CoGroupByKey()
                | "GeneralFrequency" >> beam.FlatMap(join_general_counts, general_words)
            )
            floor = self.general["words"] | "CorpusFloor" >> beam.Map(corpus_floor, unseen_count)
        return with_general | "Score" >> beam.Map(
            word_stats_row, AsSingleton(domain["words"]), AsSingleton(floor)
        )

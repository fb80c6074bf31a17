"""`maskstream stats` as Beam transforms: `CountWords` (word counts of a corpus) and `TfIcf` /
`BackgroundContrast` (scores from them). The counting and the formulas are Beam-free
(`maskstream.pipelines.statistics.counting`, `maskstream.pipelines.statistics.tf_icf`), shared with `maskstream update`.

Documents are counted in batches of about `BATCH_CHARACTERS` characters; the batches' counts are
summed keyed by word (`CombinePerKey`), so the vocabulary is spread over workers rather than
funnelled through one global dictionary, and a word is shuffled once per batch that holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.pvalue import AsSingleton

from maskstream.pipelines.corpus import Document
from maskstream.pipelines.statistics.counting import word_counts_of_texts
from maskstream.pipelines.statistics.tf_icf import (
    background_contrast,
    corpus_floor,
    word_stats_row,
    wordfreq_floor,
)
from maskstream.schemas.formulas import TF_ICF_UNSEEN_COUNT as DEFAULT_UNSEEN_COUNT

# Characters per counting batch: large enough that the per-batch costs (one element per distinct
# word of the batch into the keyed sum) stay small beside the per-character work, small enough
# that a batch's arrays (about 30 bytes a character) stay well under a worker's memory.
BATCH_CHARACTERS = 1 << 22
DOCUMENTS = "documents"
WORDS = "words"


def _document_characters(document: Document) -> int:
    return len(document.text)


def batch_documents() -> beam.BatchElements:
    """Documents in batches of about BATCH_CHARACTERS characters: the unit every counting stage works on
    (`maskstream stats`' word counts, `build --peer-signals`' n-gram and pair counts)."""
    return beam.BatchElements(min_batch_size=BATCH_CHARACTERS, max_batch_size=BATCH_CHARACTERS,
                              element_size_fn=_document_characters)


class SumCountsFn(beam.CombineFn):
    """Sums (tf, df) pairs. Does what `TupleCombineFn(sum, sum)` does at about half its cost,
    which matters: it runs once per distinct word of every batch."""

    def create_accumulator(self) -> tuple[int, int]:
        return 0, 0

    def add_input(self, accumulator: tuple[int, int], counts: tuple[int, int]) -> tuple[int, int]:
        return accumulator[0] + counts[0], accumulator[1] + counts[1]

    def merge_accumulators(self, accumulators: Iterable[tuple[int, int]]) -> tuple[int, int]:
        tf = df = 0
        for accumulator_tf, accumulator_df in accumulators:
            tf += accumulator_tf
            df += accumulator_df
        return tf, df

    def extract_output(self, accumulator: tuple[int, int]) -> tuple[int, int]:
        return accumulator


class CountBatchFn(beam.DoFn):
    """A batch of documents -> (word, (tf, df)) for each distinct word of the batch, and on the
    "documents" and "words" outputs the batch's number of documents and of word occurrences (so
    the totals cost one element per batch, not one per document or per word)."""

    def process(self, batch: Sequence[Document]) -> Iterator[Any]:
        occurrences = 0
        for word, (tf, df) in word_counts_of_texts([document.text for document in batch]):
            occurrences += tf
            yield word, (tf, df)
        yield beam.pvalue.TaggedOutput(DOCUMENTS, len(batch))
        yield beam.pvalue.TaggedOutput(WORDS, occurrences)


class CountWords(beam.PTransform):
    """PCollection[Document] -> {"counts": PCollection[(word, (tf, df))],
    "documents": PCollection[int] (singleton N), "words": PCollection[int] (singleton sum of tf)}.
    """

    def expand(self, documents: beam.PCollection) -> dict[str, beam.PCollection]:
        per_batch = (
            documents
            | "BatchDocuments" >> batch_documents()
            | "CountPerBatch" >> beam.ParDo(CountBatchFn()).with_outputs(DOCUMENTS, WORDS, main="counts")
        )
        # Sums occurrences (tf) and documents (df) in one keyed combine.
        counts = per_batch.counts | "SumPerWord" >> beam.CombinePerKey(SumCountsFn())
        document_count = per_batch[DOCUMENTS] | "SumDocuments" >> beam.CombineGlobally(sum)
        word_total = per_batch[WORDS] | "SumTermFrequencies" >> beam.CombineGlobally(sum)
        return {"counts": counts, "documents": document_count, "words": word_total}


class WordfreqFrequencyFn(beam.DoFn):
    """(word, (tf, df)) -> (word, (tf, df), f_G) with f_G from the wordfreq tables."""

    def __init__(self, language: str = "en"):
        self.language = language

    def setup(self) -> None:
        # heavy: wordfreq loads its tables only when general frequencies are read
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
    (maskstream.schemas.tables.WORD_STATS_BACKGROUND_SCHEMA).

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

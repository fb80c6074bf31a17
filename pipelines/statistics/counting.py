"""Word counts of a corpus: per word tf (occurrences) and df (documents), and N (documents).

Words are `schemas.words.words`, the one normalization every stage shares. Counting is keyed
by word (`CombinePerKey`), so the vocabulary is spread over workers rather than funnelled
through one global dictionary; each document is counted locally first, so a word is shuffled
once per document that holds it, not once per occurrence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import apache_beam as beam

from pipelines.corpus import Document
from schemas.words import words


def word_counts_of_document(document: Document) -> Iterator[tuple[str, tuple[int, int]]]:
    """(word, (occurrences in this document, 1)) for each distinct word of the document."""
    for word, count in Counter(words(document.text)).items():
        yield word, (count, 1)


class SumCountsFn(beam.CombineFn):
    """Sums (tf, df) pairs. Does what `TupleCombineFn(sum, sum)` does at about half its cost,
    which matters: it runs once per distinct word of every document."""

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


class CountWords(beam.PTransform):
    """PCollection[Document] -> {"counts": PCollection[(word, (tf, df))],
    "documents": PCollection[int] (singleton N), "words": PCollection[int] (singleton sum of tf)}.
    """

    def expand(self, documents: beam.PCollection) -> dict[str, beam.PCollection]:
        counts = (
            documents
            | "WordCountsPerDocument" >> beam.FlatMap(word_counts_of_document)
            # Sums occurrences (tf) and documents (df) in one keyed combine.
            | "SumPerWord" >> beam.CombinePerKey(SumCountsFn())
        )
        document_count = documents | "CountDocuments" >> beam.combiners.Count.Globally()
        word_total = (
            counts
            | "TermFrequencies" >> beam.Map(lambda word_tf_df: word_tf_df[1][0])
            | "SumTermFrequencies" >> beam.CombineGlobally(sum)
        )
        return {"counts": counts, "documents": document_count, "words": word_total}

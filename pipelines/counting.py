"""Word counts of a corpus: per word tf (occurrences) and df (documents), and N (documents).

Words are `schemas.words.words`, the one normalization every stage shares. Counting is keyed
by word (`CombinePerKey`), so the vocabulary is spread over workers rather than funnelled
through one global dictionary; each document is counted locally first, so a word is shuffled
once per document that holds it, not once per occurrence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.transforms.combiners import TupleCombineFn

from pipelines.corpus import Document
from schemas.words import words


def word_counts_of_document(document: Document) -> Iterator[tuple[str, tuple[int, int]]]:
    """(word, (occurrences in this document, 1)) for each distinct word of the document."""
    for word, count in Counter(words(document.text)).items():
        yield word, (count, 1)


class CountWords(beam.PTransform):
    """PCollection[Document] -> {"counts": PCollection[(word, (tf, df))],
    "documents": PCollection[int] (singleton N), "words": PCollection[int] (singleton sum of tf)}.
    """

    def expand(self, documents: beam.PCollection) -> dict[str, beam.PCollection]:
        counts = (
            documents
            | "WordCountsPerDocument" >> beam.FlatMap(word_counts_of_document)
            # Sums occurrences (tf) and documents (df) in one keyed combine.
            | "SumPerWord" >> beam.CombinePerKey(TupleCombineFn(sum, sum))
        )
        document_count = documents | "CountDocuments" >> beam.combiners.Count.Globally()
        word_total = (
            counts
            | "TermFrequencies" >> beam.Map(lambda word_tf_df: word_tf_df[1][0])
            | "SumTermFrequencies" >> beam.CombineGlobally(sum)
        )
        return {"counts": counts, "documents": document_count, "words": word_total}

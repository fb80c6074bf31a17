"""Word counts of a corpus: per word tf (occurrences) and df (documents), and N (documents).

Words are `schemas.words`' words, the one normalization every stage shares. Documents are counted
in batches of about `BATCH_CHARACTERS` characters, with array operations over the whole batch
(`word_counts_of_texts`), so no Python object is made per word; the batches' counts are then
summed keyed by word (`CombinePerKey`), so the vocabulary is spread over workers rather than
funnelled through one global dictionary, and a word is shuffled once per batch that holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.corpus import Document
from schemas.words import code_points, in_words, normalize_word, runs

# Characters per counting batch: large enough that the per-batch costs (one element per distinct
# word of the batch into the keyed sum) stay small beside the per-character work, small enough
# that a batch's arrays (about 30 bytes a character) stay well under a worker's memory.
BATCH_CHARACTERS = 1 << 22
DOCUMENTS = "documents"
WORDS = "words"


def word_counts_of_texts(texts: Sequence[str]) -> Iterator[tuple[str, tuple[int, int]]]:
    """(word, (occurrences in `texts`, texts holding it)) for each distinct word of `texts`.

    The same counts as `collections.Counter(schemas.words.words(text))` per text, summed over the
    texts (tests/pipelines/test_stats_transforms.py), computed over the batch at once: word spans from `schemas.words`' character table over the texts' code points, the
    distinct spans found by Arrow's hashing, and only those distinct spans normalized in Python.
    Spans are normalized one by one, never the whole text, because NFKC and lower-casing can
    change where words end ('½' is one word whose NFKC form '1⁄2' is not).
    """
    if not texts:
        return
    # One text with a non-word separator, so no word runs across two texts.
    joined = code_points("\n".join(texts))
    word_mask = in_words(joined)
    starts, ends = runs(word_mask)
    if len(starts) == 0:
        return
    text_starts = np.cumsum([0] + [len(text) + 1 for text in texts[:-1]])
    text_of_word = np.searchsorted(text_starts, starts, side="right") - 1
    # Each word's code points as one Arrow binary value (4 bytes a code point), for Arrow's hashing.
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(ends - starts, out=offsets[1:])
    spans = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(starts), [None, pa.py_buffer(offsets * 4), pa.py_buffer(joined[word_mask])])
    encoded = pc.dictionary_encode(spans)
    # Distinct spans -> their normalized word's index; 'The' and 'the' share one.
    word_index: dict[str, int] = {}
    index_of_span = np.fromiter(
        (word_index.setdefault(normalize_word(span.decode("utf-32-le")), len(word_index))
         for span in encoded.dictionary.to_pylist()),
        np.int64, len(encoded.dictionary))
    word_of_occurrence = index_of_span[encoded.indices.to_numpy()]
    tf = np.bincount(word_of_occurrence, minlength=len(word_index))
    # df: the distinct (text, word) pairs, counted per word (a sort: numpy's hashing unique is slower).
    pairs = np.sort(text_of_word * len(word_index) + word_of_occurrence)
    distinct_pairs = pairs[np.flatnonzero(np.diff(pairs, prepend=-1))]
    df = np.bincount(distinct_pairs % len(word_index), minlength=len(word_index))
    yield from zip(word_index, zip(tf.tolist(), df.tolist(), strict=True), strict=True)


def _document_characters(document: Document) -> int:
    return len(document.text)


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
            | "BatchDocuments" >> beam.BatchElements(
                min_batch_size=BATCH_CHARACTERS, max_batch_size=BATCH_CHARACTERS,
                element_size_fn=_document_characters)
            | "CountPerBatch" >> beam.ParDo(CountBatchFn()).with_outputs(DOCUMENTS, WORDS, main="counts")
        )
        # Sums occurrences (tf) and documents (df) in one keyed combine.
        counts = per_batch.counts | "SumPerWord" >> beam.CombinePerKey(SumCountsFn())
        document_count = per_batch[DOCUMENTS] | "SumDocuments" >> beam.CombineGlobally(sum)
        word_total = per_batch[WORDS] | "SumTermFrequencies" >> beam.CombineGlobally(sum)
        return {"counts": counts, "documents": document_count, "words": word_total}

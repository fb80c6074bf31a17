"""Word counts of a batch of texts: per word tf (occurrences) and df (texts holding it).

Words are `maskstream.mask_signal.words`' words, the one normalization every stage shares. A batch is counted
with array operations over the whole batch (`word_counts_of_texts`), so no Python object is made
per word. `maskstream stats` sums the batches' counts keyed by word
(`maskstream.pipelines.statistics.stats_transforms.CountWords`); `maskstream update` sums them per file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maskstream.mask_signal.words import code_points, in_words, normalize_word, runs


def word_counts_of_texts(texts: Sequence[str]) -> Iterator[tuple[str, tuple[int, int]]]:
    """(word, (occurrences in `texts`, texts holding it)) for each distinct word of `texts`.

    The same counts as `collections.Counter(maskstream.mask_signal.words.words(text))` per text, summed over the
    texts (tests/pipelines/test_stats_transforms.py), computed over the batch at once: word spans from `maskstream.mask_signal.words`' character table over the texts' code points, the
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

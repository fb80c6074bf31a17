"""Word types as compact arrays: how a build numbers, scores and finds millions of words.

A corpus of 1-50 GB has millions of word types. Every step that needs "the row of this word" or
"this word's similarity" uses these arrays instead of a Python dict of strings (hundreds of
bytes a word): a worker holds, per word type,

    keys        uint64   the word's 64-bit blake2b hash, sorted (for `numpy.searchsorted`)   8 B
    index       int32    the word's `word_index` (its rank in word order), aligned with keys  4 B
    similarity  float32  by word_index                                                        4 B
    nearest     int16    by word_index: the nearest seed's position in `seeds`, -1 if skipped  2 B

18 bytes a word type (`WordLookup.nbytes` + the build's `WordScores.nbytes`,
`maskstream.pipelines.dataset.core.vocabulary`), so 10 M types are about 180 MB.
`word_index` is the word's position in sorted word order, as it always was, so shards and word
tables keep their values; the only step that holds the words' text at once is `WordLookup.of`,
as one Arrow string column (no Python objects), once per build.

Two words with the same 64-bit hash (a chance of n^2 / 2^65: 3e-6 for 10 M types)
are refused with a message rather than silently merged.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

HASH_SLICE = 65_536  # words turned into Python strings at once while hashing


def word_keys(words: Iterable[str]) -> np.ndarray:
    """A 64-bit key per word (blake2b of its UTF-8 bytes): fixed width, whatever the word's length."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                       "little") for word in words), np.uint64)


@dataclasses.dataclass(frozen=True)
class WordLookup:
    """Word -> word_index over a vocabulary, as sorted hashes: 12 bytes a word type."""

    keys: np.ndarray  # uint64, sorted
    index: np.ndarray  # int32, the word_index of keys[i]

    @classmethod
    def of(cls, words: pa.Array | pa.ChunkedArray | Sequence[str]) -> WordLookup:
        """The lookup of distinct `words` in any order: word_index = rank in sorted (code point) order."""
        # heavy: this pyarrow module loads only when data is read: importing this module stays light
        import pyarrow.compute as pc

        words = pa.chunked_array([words]) if not isinstance(words, pa.ChunkedArray | pa.Array) else words
        words = words.combine_chunks() if isinstance(words, pa.ChunkedArray) else words
        rank = np.empty(len(words), np.int32)
        rank[pc.sort_indices(words).to_numpy()] = np.arange(len(words), dtype=np.int32)
        return cls.indexed(words, rank)

    @classmethod
    def indexed(cls, words: pa.Array, index: np.ndarray) -> WordLookup:
        """The lookup of distinct `words` whose word_index is already known (`index[i]` for `words[i]`)."""
        # Hashed a slice at a time: never a Python string for every word at once.
        keys = np.concatenate([np.zeros(0, np.uint64)] + [word_keys(words.slice(start, HASH_SLICE).to_pylist())
                                                          for start in range(0, len(words), HASH_SLICE)])
        by_key = np.argsort(keys, kind="stable")
        keys = keys[by_key]
        if np.any(keys[1:] == keys[:-1]):
            raise ValueError("two word types of the statistics have the same 64-bit hash (or a word is listed "
                             "twice): rerun `maskstream stats`; if it persists, report the words")
        return cls(keys=keys, index=np.asarray(index, np.int32)[by_key])

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.index.nbytes

    def index_of(self, words: Sequence[str]) -> np.ndarray:
        """The word_index of each word, -1 for a word the vocabulary does not hold."""
        keys = word_keys(words)
        if not len(self.keys):
            return np.full(len(keys), -1, np.int32)
        position = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[position] == keys, self.index[position], -1).astype(np.int32)

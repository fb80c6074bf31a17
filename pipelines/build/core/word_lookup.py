"""Word types as compact arrays: how a build numbers, scores and finds millions of words.

A corpus of 1-50 GB has millions of word types. Every step that needs "the row of this word" or
"this word's similarity" uses these arrays instead of a Python dict of strings (hundreds of
bytes a word): a worker holds, per word type,

    keys        uint64   the word's 64-bit blake2b hash, sorted (for `numpy.searchsorted`)   8 B
    index       int32    the word's `word_index` (its rank in word order), aligned with keys  4 B
    similarity  float32  by word_index                                                        4 B
    nearest     int16    by word_index: the nearest seed's position in `seeds`, -1 if skipped  2 B

18 bytes a word type (`WordLookup.nbytes` + `WordScores.nbytes`), so 10 M types are about 180 MB.
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

from maskstream.pipelines.build.core.vocabulary import SKIPPED, fallback_similarity

HASH_SLICE = 65_536  # words turned into Python strings at once while hashing
SKIPPED_SEED = -1  # `WordScores.nearest` of a word the encoder did not see (pipelines/build/core/vocabulary.py)


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


@dataclasses.dataclass(frozen=True)
class WordScores:
    """Every word type's similarity and nearest seed, by word_index: 6 bytes a word type."""

    similarity: np.ndarray  # float32; a skipped word has the fallback (pipelines/build/core/vocabulary.py)
    nearest: np.ndarray  # int16: position in `seeds`, SKIPPED_SEED for a word the encoder skipped
    seeds: tuple[str, ...]  # sorted
    fallback: float | None  # the skipped words' similarity; None when none was skipped

    @classmethod
    def of(cls, encoded: pa.Table, word_types: int, seeds: Iterable[str]) -> WordScores:
        """From the encoded words' rows (`word_index`, `similarity`, `nearest_seed`; any order) of a
        vocabulary of `word_types` types; every other type gets the fallback similarity."""

        seeds = tuple(sorted(set(seeds)))
        if len(seeds) > np.iinfo(np.int16).max:
            raise ValueError(f"{len(seeds)} seeds: at most {np.iinfo(np.int16).max} are supported")
        encoded = encoded.sort_by("word_index")
        index = encoded.column("word_index").to_numpy()
        similarity = encoded.column("similarity").to_numpy()
        fallback = fallback_similarity(similarity) if len(index) < word_types else None
        dense = np.full(word_types, np.float32(0.0) if fallback is None else fallback, np.float32)
        dense[index] = similarity
        position = {seed: i for i, seed in enumerate(seeds)}
        nearest = np.full(word_types, SKIPPED_SEED, np.int16)
        nearest[index] = np.fromiter((position[s] for s in encoded.column("nearest_seed").to_pylist()), np.int16,
                                     len(index))
        return cls(similarity=dense, nearest=nearest, seeds=seeds,
                   fallback=None if fallback is None else float(fallback))

    @property
    def nbytes(self) -> int:
        return self.similarity.nbytes + self.nearest.nbytes

    @property
    def encoded(self) -> np.ndarray:
        return self.nearest != SKIPPED_SEED

    def nearest_seeds(self, word_index: np.ndarray) -> list[str]:
        """The nearest seed of each word_index ("" for a skipped word, as the word table writes it)."""

        names = (*self.seeds, SKIPPED)  # SKIPPED_SEED = -1 picks the last
        return [names[n] for n in self.nearest[word_index]]

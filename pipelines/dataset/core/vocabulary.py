"""The vocabulary policy: which word types the word encoder sees, what the others get, and the coverage.

The encoder's cost grows with the number of distinct word types, and most types of a corpus are
rare (Zipf): on the Debian descriptions 40 % of the types occur once. `--min-word-count N` skips
the encoder for every word type counted fewer than N times in the corpus (the `tf` of
`maskstream stats`; `update` and `watch` merge their own per-file counts, which are the same).
Seeds are always encoded (the other words are scored against them), so a seed is never skipped.
N = 1, the default, encodes every type: the dataset is bit for bit what it was before the policy.

Fallback: a skipped word's similarity is the mean similarity of the encoded word types
(`FALLBACK`), taken in float64 over the word table in `word_index` order, stored as float32. Its
tokens then go through the same map as every word's (sharpness, floor, alpha, budget), so each
sequence's budget stays exact. Why not the floor (similarity 0): under the paper's map (alpha 1,
floor 0) a weight of 0 makes a word unmaskable, so every rare word, rare domain terms included,
would never be masked and its share of the budget would move to the frequent words. The mean
scores an unseen-by-the-encoder word as a typical word type: the guess that knows nothing about it.

Skipped words keep their row in the word table (`word_index` does not change) with
`nearest_seed` = "" (`SKIPPED`). The manifest's `vocabulary` records the threshold, the fallback,
the types encoded and skipped, and the coverage: the share of word occurrences (from the counts)
and of tokens (from the shards: non-special tokens inside a word) whose word was encoded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FALLBACK = "mean similarity of the encoded word types"
SKIPPED = ""  # `nearest_seed` of a word the encoder did not see
SKIPPED_SEED = -1  # `WordScores.nearest` of a word the encoder did not see


def check_min_word_count(min_word_count: int) -> None:
    if min_word_count < 1:
        raise ValueError(f"--min-word-count must be >= 1, got {min_word_count}")


def encoded_mask(words: pa.Array, tf: np.ndarray, min_word_count: int, seeds: Iterable[str]) -> np.ndarray:
    """The rule: which of a batch of word types the encoder sees: counted `min_word_count` times, or a seed."""
    seeds = pa.array(sorted(set(seeds)), pa.string())
    return (np.asarray(tf) >= min_word_count) | pc.is_in(words, seeds).to_numpy(zero_copy_only=False)


def encoded_words(words: pa.Array, tf: np.ndarray, min_word_count: int, seeds: Iterable[str]) -> list[str]:
    """The word types the encoder sees (`encoded_mask`), in the order of `words`. Refuses a threshold
    that leaves no word of the corpus to encode."""
    check_min_word_count(min_word_count)
    encoded = words.filter(pa.array(encoded_mask(words, tf, min_word_count, seeds))).to_pylist()
    if not encoded:
        raise ValueError(f"--min-word-count {min_word_count} leaves no word type to encode (the most frequent word "
                         f"occurs {int(np.max(tf, initial=0))} times)")
    return encoded


def fallback_similarity(encoded_similarity: np.ndarray) -> np.float32:
    """`FALLBACK`: the mean of the encoded words' similarities (float64 sum, in the order given)."""
    return np.float32(np.asarray(encoded_similarity, np.float64).mean())


def token_coverage(tallies: dict[str, dict[str, np.ndarray]] | None, scores: Any) -> dict[str, Any]:
    """Tokens inside a word, and those whose word was encoded, from the build's signal tallies
    (`maskstream.pipelines.dataset.core.signal_tallies`: non-special tokens per word type) and the words' `WordScores`
    (above); the fallback similarity the skipped words got (None when
    none was skipped)."""
    built = next(iter(tallies.values())) if tallies else {"words": np.zeros(0, np.int64), "tokens": np.zeros(0, np.int64)}
    tokens = built["tokens"]
    in_words, covered = int(tokens.sum()), int(tokens[scores.encoded[built["words"]]].sum())
    return {
        "fallback_similarity": scores.fallback,
        "tokens_in_words": in_words,
        "tokens_encoded": covered,
        "token_coverage": covered / in_words if in_words else 1.0,
    }


def vocabulary_line(vocabulary: Mapping[str, Any]) -> str:
    """One line for the build's output and `maskstream inspect` ("" for a version made before the policy)."""
    if not vocabulary:
        return ""
    fallback = vocabulary.get("fallback_similarity")
    return (f"vocabulary       min word count {vocabulary['min_word_count']}: {vocabulary['word_types_encoded']} of "
            f"{vocabulary['word_types']} word types encoded, {vocabulary['word_types_skipped']} skipped"
            + (f" (similarity {fallback:.4f}, the {vocabulary['fallback']})" if fallback is not None else "")
            + f"; coverage {vocabulary['token_coverage']:.2%} of tokens in words, "
              f"{vocabulary['word_occurrence_coverage']:.2%} of word occurrences")


@dataclasses.dataclass(frozen=True)
class WordScores:
    """Every word type's similarity and nearest seed, by word_index: 6 bytes a word type."""

    similarity: np.ndarray  # float32; a skipped word has the fallback (`FALLBACK`)
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

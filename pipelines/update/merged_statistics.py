"""The update's statistics: the cache's per-file word counts merged into `maskstream stats`' rows,
the seeds `maskstream seeds` chooses from them (and its seeds.json), the words the encoder sees, and
every word type's score against the seeds: the same functions as those commands, on counts that are
already in memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.pipelines.dataset.core.vocabulary import WordScores, encoded_words
from maskstream.pipelines.dataset.steps import collect_word_scores, nearest_seed_rows, vocabulary_index
from maskstream.pipelines.statistics.seed_selection import SeedRanking, load_stop_words
from maskstream.pipelines.statistics.seeds import seeds_document
from maskstream.pipelines.statistics.tf_icf import word_stats_row, wordfreq_floor
from maskstream.pipelines.update.cache import FileEntry, general_frequencies
from maskstream.schemas.formulas import FORMULA_VERSIONS


@dataclasses.dataclass
class Statistics:
    """The merged word statistics and what they decide: the seeds and the words the encoder sees."""

    rows: list[dict]  # WORD_STATS rows sorted by word
    documents: int  # documents the reader accepted (those without a token included)
    total_words: int
    ranking: SeedRanking
    seeds: list[str]
    vocabulary: pa.Array  # the word types, sorted: position = word_index
    tf: np.ndarray  # each word type's count, in vocabulary order
    index: WordLookup  # word -> word_index
    encoded: list[str]


def word_stats(entries: Iterable[FileEntry], language: str, unseen_count: float, cache_url: str
               ) -> tuple[list[dict], int, int]:
    """(WORD_STATS rows sorted by word, documents N, total words), as `maskstream stats` computes them."""
    entries = list(entries)
    documents = sum(entry.documents for entry in entries)
    # Sum (tf, df) per word over the files, in Arrow; then one row per word, sorted by word.
    merged = pa.concat_tables([entry.words for entry in entries]).group_by("word").aggregate(
        [("tf", "sum"), ("df", "sum")]).sort_by("word")
    frequencies = general_frequencies(cache_url, language, merged.column("word").combine_chunks())
    words, tf, df = (merged.column(c).to_pylist() for c in ("word", "tf_sum", "df_sum"))
    total = sum(tf)
    floor = wordfreq_floor(unseen_count)
    rows = [word_stats_row((w, (t, d), f), total, floor)
            for w, t, d, f in zip(words, tf, df, frequencies.tolist(), strict=True)]
    return rows, documents, total


def merged_statistics(entries: Sequence[FileEntry], seed_filters: dict[str, Any], general_language: str,
                      unseen_count: float, min_word_count: int, cache_url: str, inputs: Sequence[str]) -> Statistics:
    """`maskstream stats` and `seeds` on the merged per-file counts; the words to encode.
    `seed_filters`: top_k, min_df, min_length, stop_words (a list's name) and alphabetic_only."""
    rows, documents, total_words = word_stats(entries, general_language, unseen_count, cache_url)
    if not rows:
        raise ValueError(f"no word in {' '.join(inputs)}")
    filters = {k: v for k, v in seed_filters.items() if k != "top_k"}
    ranking = SeedRanking(seed_filters["top_k"], **{**filters, "stop_words": load_stop_words(filters["stop_words"])})
    ranking.add(rows)
    if not ranking.seeds:
        raise ValueError(f"no word of {len(rows)} passes the seed filters")
    seeds = [row["word"] for row in ranking.seeds]
    vocabulary = pa.array([row["word"] for row in rows], pa.string())
    tf = np.array([row["tf"] for row in rows], np.int64)
    return Statistics(rows, documents, total_words, ranking, seeds, vocabulary, tf, vocabulary_index(vocabulary),
                      encoded_words(vocabulary, tf, min_word_count, seeds))


def update_seeds_document(statistics: Statistics, seed_filters: dict[str, Any], stats_config: dict[str, Any],
                          fingerprint: dict[str, Any]) -> dict[str, Any]:
    """seeds.json of an update: `maskstream seeds`' document (general contrast: an update has no
    background corpus), with the statistics' settings as its "stats_config"."""
    seeds = statistics.ranking.seeds
    config = {**seed_filters, "contrast": "general", "stats_config": stats_config}
    return seeds_document(statistics.ranking, {row["word"]: rank for rank, row in enumerate(seeds, start=1)},
                          "general", config, statistics.total_words, dict(FORMULA_VERSIONS), fingerprint)


def word_similarity(statistics: Statistics, embeddings: dict[str, np.ndarray], reduce: str) -> WordScores:
    """Every word type's WordScores: each encoded word scored against the seeds, the others the fallback."""
    encoded = statistics.encoded
    scored = nearest_seed_rows(encoded, np.stack([embeddings[w] for w in encoded]),
                         [(seed, embeddings[seed]) for seed in statistics.seeds], reduce, statistics.index)
    return collect_word_scores([scored], len(statistics.index), statistics.seeds)

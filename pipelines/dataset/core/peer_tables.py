"""The peers' signals as a version's tables, for both of the build's drivers: the collocation
vocabulary and the informativeness of every word type (pipelines/statistics/peer_formulas.py has
the formulas), keyed by the word table's `word_index` so the loader joins them to the shards'
`word_index` column."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.pipelines.statistics.peer_formulas import (
    MAX_N,
    SENTENCE_WORDS,
    Ngram,
    PeerSignalSettings,
    mask_weights,
)
from maskstream.schemas.formulas import PEER_FORMULA_VERSIONS
from maskstream.schemas.manifest import COLLOCATIONS_NAME, INFORMATIVENESS_NAME
from maskstream.schemas.tables import COLLOCATION_SCHEMA, INFORMATIVENESS_SCHEMA


def words_known(lookup: WordLookup) -> Callable[[Ngram], bool]:
    """Whether the word table holds every word of an n-gram: the vocabulary keeps only those (both
    drivers filter with it before the vocabulary's cut), since the loader matches word_index."""
    return lambda ngram: bool(lookup.index_of(list(ngram)).min() >= 0)


def collocation_table(rows: Sequence[tuple[Ngram, int, float]], lookup: WordLookup) -> pa.Table:
    """The vocabulary's rows (best first, as `collocation_vocabulary` orders them, every word known:
    `words_known`) with their words' word_index."""
    words = [word for ngram, _, _ in rows for word in ngram]
    index = lookup.index_of(words) if words else np.zeros(0, np.int32)
    if (index < 0).any():
        raise ValueError("a collocation holds a word the word table lacks: filter the vocabulary with words_known")
    bounds = np.cumsum([0] + [len(ngram) for ngram, _, _ in rows])
    return pa.table({
        "ngram": [" ".join(ngram) for ngram, _, _ in rows],
        "n": pa.array([len(ngram) for ngram, _, _ in rows], pa.int8()),
        "count": pa.array([count for _, count, _ in rows], pa.int64()),
        "pmi": pa.array([pmi for _, _, pmi in rows], pa.float64()),
        "word_index": pa.array([index[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True)],
                               pa.list_(pa.int32())),
    }, schema=COLLOCATION_SCHEMA)


def informativeness_table(words: Sequence[str], sentences: Sequence[int], relevances: Sequence[float],
                          lookup: WordLookup) -> pa.Table:
    """One row per word type of the word table, by word_index: the sentences holding it and its
    relevance (0 for a word no sentence of the inputs holds), and the mask weight of that relevance."""
    word_types = len(lookup)
    index = lookup.index_of(list(words)) if len(words) else np.zeros(0, np.int32)
    known = index >= 0
    sentence_counts = np.zeros(word_types, np.int64)
    relevance = np.zeros(word_types, np.float64)
    sentence_counts[index[known]] = np.asarray(sentences, np.int64)[known]
    relevance[index[known]] = np.asarray(relevances, np.float64)[known]
    return pa.table({
        "word_index": pa.array(np.arange(word_types, dtype=np.int32)),
        "sentences": sentence_counts,
        "relevance": relevance,
        "mask_weight": mask_weights(relevance),
    }, schema=INFORMATIVENESS_SCHEMA)


def peer_signals_entry(settings: PeerSignalSettings, collocations: int, total_sentences: int) -> dict[str, Any]:
    """The manifest's `peer_signals`: settings, formulas, files and sizes."""
    return {
        "settings": {**dataclasses.asdict(settings), "max_n": MAX_N, "sentence_words": SENTENCE_WORDS},
        "formulas": dict(PEER_FORMULA_VERSIONS),
        "collocations": COLLOCATIONS_NAME,
        "informativeness": INFORMATIVENESS_NAME,
        "collocation_count": collocations,
        "sentences": total_sentences,
    }

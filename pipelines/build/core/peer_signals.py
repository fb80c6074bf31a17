"""The peers' signals as a version's tables, for both of the build's drivers: the collocation
vocabulary and the informativeness of every word type (pipelines/statistics/collocations.py has
the formulas), keyed by the word table's `word_index` so the loader joins them to the shards'
`word_index` column."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.pipelines.statistics.collocations import (
    MAX_N,
    SENTENCE_WORDS,
    Ngram,
    PeerSignalSettings,
    mask_weights,
)
from maskstream.schemas.formulas import PEER_FORMULA_VERSIONS
from maskstream.schemas.manifest import COLLOCATIONS_NAME, INFORMATIVENESS_NAME
from maskstream.schemas.tables import COLLOCATION_SCHEMA, INFORMATIVENESS_SCHEMA


def collocation_table(rows: Iterable[tuple[Ngram, int, float]], lookup: WordLookup) -> pa.Table:
    """The vocabulary's rows (best first, as `collocation_vocabulary` orders them) with their words'
    word_index; an n-gram with a word the word table lacks (inputs other than the statistics') is dropped."""
    rows = list(rows)
    words = [word for ngram, _, _ in rows for word in ngram]
    index = lookup.index_of(words) if words else np.zeros(0, np.int32)
    bounds = np.cumsum([0] + [len(ngram) for ngram, _, _ in rows])
    per_row = [index[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    kept = [i for i, indices in enumerate(per_row) if len(indices) and indices.min() >= 0]
    return pa.table({
        "ngram": [" ".join(rows[i][0]) for i in kept],
        "n": pa.array([len(rows[i][0]) for i in kept], pa.int8()),
        "count": pa.array([rows[i][1] for i in kept], pa.int64()),
        "pmi": pa.array([rows[i][2] for i in kept], pa.float64()),
        "word_index": pa.array([per_row[i].tolist() for i in kept], pa.list_(pa.int32())),
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

"""PMI-Masking's units as the loader computes them for a window of rows at once
(`PeerSignals.span_ids_of_rows`), against a plain per-row greedy written here: the rule of
maskstream.mask_signal.peer_lookup, one match at a time. Hypothesis draws the rows (punctuation,
words of several tokens, specials, rows without words) and the collocation table."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from maskstream.mask_signal.peer_lookup import PeerSignals, hash_rows


def reference_units(word_ids: list[int], word_index: list[int], collocations: set[tuple[int, ...]]) -> list[int]:
    """Longest first, then leftmost, never overlapping, over consecutive occurrences that are words of the
    table (a punctuation token, an unknown word or a special token in between ends a match)."""
    occurrences: dict[int, int] = {}
    segment_of: dict[int, int] = {}
    segment = 0
    for occurrence, index in zip(word_ids, word_index, strict=True):
        if occurrence < 0:
            segment += 1
            continue
        occurrences.setdefault(occurrence, index)
        segment_of.setdefault(occurrence, segment)
    count = max(occurrences, default=-1) + 1
    unit = list(range(count))
    covered = [False] * count
    for n in range(5, 1, -1):
        for start in range(count - n + 1):
            window = range(start, start + n)
            if any(occurrences.get(k, -1) < 0 for k in window) or segment_of[start] != segment_of[start + n - 1]:
                continue
            if tuple(occurrences[k] for k in window) in collocations and not any(covered[k] for k in window):
                for k in window:
                    covered[k] = True
                    unit[k] = start
    rank = {value: i for i, value in enumerate(sorted(set(unit)))}
    return [rank[unit[w]] if w >= 0 else -1 for w in word_ids]


@st.composite
def rows(draw) -> tuple[list[int], list[int]]:
    """One row: specials at both ends, words of 1-3 tokens from a vocabulary of 6 (so n-grams recur),
    punctuation tokens or unknown words (word_index -1) between them, and now and then a special token
    inside (the separator of a packed window's documents)."""
    word_ids, word_index = [-1], [-1]
    for occurrence in range(draw(st.integers(0, 14))):
        if draw(st.integers(0, 9)) == 0:
            word_ids.append(-1)
            word_index.append(-1)
        is_punctuation = draw(st.booleans()) and draw(st.booleans())
        index = -1 if is_punctuation else draw(st.integers(0, 5))
        tokens = 1 if is_punctuation else draw(st.integers(1, 3))
        word_ids += [occurrence] * tokens
        word_index += [index] * tokens
    return word_ids + [-1], word_index + [-1]


ngram_tables = st.sets(st.lists(st.integers(0, 5), min_size=2, max_size=5).map(tuple), max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=6), ngram_tables)
def test_units_of_a_window_equal_the_per_row_greedy(window, collocations):
    by_length: dict[int, list[tuple[int, ...]]] = {}
    for ngram in collocations:
        by_length.setdefault(len(ngram), []).append(ngram)
    signals = PeerSignals({n: np.sort(hash_rows(np.array(grams))) for n, grams in by_length.items()},
                          np.zeros(6, np.float32))
    word_ids = np.concatenate([np.array(r[0]) for r in window])
    word_index = np.concatenate([np.array(r[1]) for r in window])
    offsets = np.cumsum([0] + [len(r[0]) for r in window])
    got = signals.span_ids_of_rows(word_ids, word_index, offsets)
    expected = [u for ids, indices in window for u in reference_units(ids, indices, collocations)]
    assert got.tolist() == expected
    for (ids, indices), start, end in zip(window, offsets[:-1], offsets[1:], strict=True):
        assert signals.span_ids(np.array(ids), np.array(indices)).tolist() == got[start:end].tolist()


def test_tables_of_another_word_table_are_refused_on_load():
    """`of_tables` checks that the informativeness table has one row per word type, 0..N-1, and that the
    collocations name only those word types: tables from another word table would weigh other words."""
    import pyarrow as pa
    import pytest

    from maskstream.schemas.tables import COLLOCATION_SCHEMA, INFORMATIVENESS_SCHEMA

    def informativeness(indices):
        count = len(indices)
        return pa.Table.from_pydict({"word_index": indices, "sentences": [1] * count, "relevance": [0.5] * count,
                                     "mask_weight": [0.5] * count}, schema=INFORMATIVENESS_SCHEMA)

    def collocations(*units):
        return pa.Table.from_pydict({"ngram": ["a b"] * len(units), "n": [len(u) for u in units],
                                     "count": [3] * len(units), "pmi": [1.0] * len(units),
                                     "word_index": [list(u) for u in units]}, schema=COLLOCATION_SCHEMA)

    signals = PeerSignals.of_tables(collocations((0, 2)), informativeness([2, 0, 1]))  # any row order
    assert signals.token_weights(np.array([1, -1, 2])).tolist() == [0.5, 0.0, 0.5]
    with pytest.raises(ValueError, match="must run 0..2"):
        PeerSignals.of_tables(collocations((0, 1)), informativeness([0, 1, 5]))
    with pytest.raises(ValueError, match="must run 0..2"):
        PeerSignals.of_tables(collocations((0, 1)), informativeness([0, 1, 1]))
    with pytest.raises(ValueError, match="outside the 3 word types"):
        PeerSignals.of_tables(collocations((0, 3)), informativeness([0, 1, 2]))

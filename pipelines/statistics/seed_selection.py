"""Choosing seed words from word statistics: the filters and the ranking, shared by `maskstream
seeds` (pipelines/statistics/seeds.py) and `maskstream update` (pipelines/update/incremental.py)."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from typing import Any

from maskstream.mask_signal.words import normalize_word
from maskstream.pipelines.statistics.stop_words import ENGLISH_STOP_WORDS

DEFAULT_TOP_K = 20
# 3: a word in at least three documents is the domain's, not one document's (a package's own
# name, a typo); on the shipped sample (2,288 documents) df < 3 removes 8,011 of 13,131 words.
DEFAULT_MIN_DF = 3
# 3: keeps domain acronyms ('dna', 'fft', 'cad') and drops 2-letter abbreviations and units.
DEFAULT_MIN_LENGTH = 3
REPORT_CANDIDATES = 50  # rows of the seeds report's table of the best-scored words


def load_stop_words(spec: str) -> frozenset[str]:
    """The stop-word set `spec` names, in the normalized word form."""

    if spec == "english":
        return ENGLISH_STOP_WORDS
    if spec == "none":
        return frozenset()
    # fsspec and its filesystems load only when a path is opened: importing this module stays light
    import fsspec

    with fsspec.open(spec, "r", encoding="utf-8") as f:
        return frozenset(normalize_word(line.strip()) for line in f if line.strip())


def filter_reasons(row: dict[str, Any], *, min_df: int, min_length: int, stop_words: frozenset[str],
                   alphabetic_only: bool) -> list[str]:
    """The filters that remove `row`'s word; empty when it may be a seed."""
    word = row["word"]
    reasons = []
    if row["df"] < min_df:
        reasons.append(f"df < {min_df}")
    if word in stop_words:
        reasons.append("stop word")
    if alphabetic_only and not word.isalpha():
        reasons.append("non-alphabetic")
    if len(word) < min_length:
        reasons.append(f"shorter than {min_length}")
    return reasons


def _best_first(row: dict[str, Any], score: str) -> tuple[float, str]:
    return -row[score], row["word"]


class SeedRanking:
    """Word-stats rows, fed in batches -> the seeds and the report's figures, holding only the
    best rows seen so far: memory is flat in the vocabulary.

    Keeps the top `top_k` rows the filters keep by `score` (the seeds), the top REPORT_CANDIDATES
    rows of all by `score` with the filters that remove them (the report's table), the top `top_k`
    kept rows by TF-ICF alone (what the background contrast drops), and how many words each filter
    removes. Ties are broken by the word, so the result does not depend on the batches' order.
    """

    def __init__(self, top_k: int, score: str = "tf_icf", **filters: Any):
        self.top_k, self.score, self.filters = top_k, score, filters
        self.seeds: list[dict[str, Any]] = []
        self.candidates: list[tuple[dict[str, Any], list[str]]] = []
        self.by_tf_icf: list[dict[str, Any]] = []
        self.removed: Counter[str] = Counter()
        self.words = 0

    def add(self, rows: Iterable[dict[str, Any]]) -> None:
        judged = [(row, filter_reasons(row, **self.filters)) for row in rows]
        kept = [row for row, reasons in judged if not reasons]
        self.words += len(judged)
        self.removed.update(reason for _, reasons in judged for reason in reasons)
        self.seeds = heapq.nsmallest(self.top_k, [*self.seeds, *kept], key=lambda r: _best_first(r, self.score))
        self.by_tf_icf = heapq.nsmallest(self.top_k, [*self.by_tf_icf, *kept], key=lambda r: _best_first(r, "tf_icf"))
        self.candidates = heapq.nsmallest(REPORT_CANDIDATES, [*self.candidates, *judged],
                                          key=lambda pair: _best_first(pair[0], self.score))

    def tf_icf_ranks(self, batches: Iterable[list[dict[str, Any]]]) -> dict[str, int]:
        """Each seed's rank by TF-ICF alone among the words the filters keep: a second pass over
        the rows (the seeds are known only after the first)."""
        ahead = {row["word"]: 1 for row in self.seeds}
        keys = {row["word"]: _best_first(row, "tf_icf") for row in self.seeds}
        for rows in batches:
            for row in rows:
                key = _best_first(row, "tf_icf")
                for word, seed_key in keys.items():
                    if key < seed_key and not filter_reasons(row, **self.filters):
                        ahead[word] += 1
        return ahead



"""Choosing seed words from word statistics: the filters and the ranking, shared by `maskstream
seeds` (pipelines/statistics/seeds.py) and `maskstream update` (pipelines/lifecycle/incremental.py)."""

from __future__ import annotations

from typing import Any

DEFAULT_TOP_K = 20
# 3: a word in at least three documents is the domain's, not one document's (a package's own
# name, a typo); on the shipped sample (2,288 documents) df < 3 removes 8,011 of 13,131 words.
DEFAULT_MIN_DF = 3
# 3: keeps domain acronyms ('dna', 'fft', 'cad') and drops 2-letter abbreviations and units.
DEFAULT_MIN_LENGTH = 3


def load_stop_words(spec: str) -> frozenset[str]:
    """The stop-word set `spec` names, in the normalized word form."""
    from schemas.words import normalize_word

    if spec == "english":
        from pipelines.statistics.stop_words import ENGLISH_STOP_WORDS

        return ENGLISH_STOP_WORDS
    if spec == "none":
        return frozenset()
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


def select_seeds(rows: list[dict[str, Any]], top_k: int, score: str = "tf_icf",
                 **filters: Any) -> tuple[list[dict], list[tuple[dict, list[str]]]]:
    """(seeds best first, every row by descending `score` with the filters that remove it)."""
    ranked = sorted(rows, key=lambda r: (-r[score], r["word"]))
    judged = [(row, filter_reasons(row, **filters)) for row in ranked]
    seeds = [row for row, reasons in judged if not reasons][:top_k]
    return seeds, judged

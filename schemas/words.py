"""The one word normalization that statistics, seeds, word ids and whole-word masking share.

A *word* is a maximal run of Unicode letters and digits (`[^\\W_]+`) found in the original
text, then normalized with Unicode NFKC and lower-cased. Spans are found before
normalization so that each word keeps its character offsets in the document, which is what
lets the build map every tokenizer token back to the word that was counted.

For BERT-style tokenizers these spans coincide with the pre-tokenizer's words (it splits on
whitespace and on punctuation, `_` included).
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np

WORD_NORMALIZATION = "nfkc-lower-alnum-v1"
WORD_PATTERN = re.compile(r"[^\W_]+")
_WORD_SPLIT = re.compile(f"({WORD_PATTERN.pattern})")


def normalize_word(span: str) -> str:
    """NFKC, then lower case."""
    return unicodedata.normalize("NFKC", span).lower()


def word_spellings(text: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(starts, ends, spellings as written) of every word of `text`: one regex split, and the
    offsets from the lengths of the pieces (no Python object per match)."""
    pieces = _WORD_SPLIT.split(text)  # [gap, word, gap, word, ..., gap]
    ends = np.cumsum(np.fromiter(map(len, pieces), np.int64, len(pieces)))
    return ends[0::2][:-1], ends[1::2], pieces[1::2]


def word_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, normalized word) for every word of `text`, offsets into `text`."""
    starts, ends, spellings = word_spellings(text)
    return [(int(s), int(e), normalize_word(w)) for s, e, w in zip(starts, ends, spellings, strict=True)]


def words(text: str) -> list[str]:
    """The normalized words of `text`, in order."""
    return [normalize_word(m.group()) for m in WORD_PATTERN.finditer(text)]

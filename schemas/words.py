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

WORD_NORMALIZATION = "nfkc-lower-alnum-v1"
WORD_PATTERN = re.compile(r"[^\W_]+")


def normalize_word(span: str) -> str:
    """NFKC, then lower case."""
    return unicodedata.normalize("NFKC", span).lower()


def word_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, normalized word) for every word of `text`, offsets into `text`."""
    return [(m.start(), m.end(), normalize_word(m.group())) for m in WORD_PATTERN.finditer(text)]


def words(text: str) -> list[str]:
    """The normalized words of `text`, in order."""
    return [normalize_word(m.group()) for m in WORD_PATTERN.finditer(text)]

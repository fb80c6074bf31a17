"""The one word normalization that statistics, seeds, word ids and whole-word masking share.

A *word* is a maximal run of Unicode letters and digits (`[^\\W_]+`) found in the original
text, then normalized with Unicode NFKC and lower-cased. Spans are found before
normalization so that each word keeps its character offsets in the document, which is what
lets the build map every tokenizer token back to the word that was counted.

For BERT-style tokenizers these spans coincide with the pre-tokenizer's words (it splits on
whitespace and on punctuation, `_` included).
"""

from __future__ import annotations

import functools
import re
import unicodedata

import numpy as np

WORD_PATTERN = re.compile(r"[^\W_]+")


def normalize_word(span: str) -> str:
    """NFKC, then lower case."""
    return unicodedata.normalize("NFKC", span).lower()


@functools.cache
def word_character_table() -> np.ndarray:
    """True at every code point `WORD_PATTERN` matches: the pattern run once over all of
    Unicode, so the table cannot drift from it."""
    table = np.zeros(0x110000, bool)
    for match in WORD_PATTERN.finditer("".join(map(chr, range(0x110000)))):
        table[match.start() : match.end()] = True
    table.flags.writeable = False  # shared by every caller of this process
    return table


def code_points(text: str) -> np.ndarray:
    """The code points of `text`, one per string index (lone surrogates kept: a JSON reader lets them through)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)


def in_words(code_points: np.ndarray) -> np.ndarray:
    """True at every code point `WORD_PATTERN` matches, one table look-up each."""
    return np.take(word_character_table(), code_points)  # take: 2x fancy indexing here


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of True in `mask`."""
    edges = np.flatnonzero(np.diff(mask.view(np.int8), prepend=np.int8(0), append=np.int8(0)))
    return edges[0::2], edges[1::2]


def word_boundaries(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of every word of `text`, as string indices: `WORD_PATTERN`'s matches,
    found with one table look-up per character instead of a regex scan (several times faster
    on long texts, no Python object per word)."""
    return runs(in_words(code_points(text)))


def word_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, normalized word) for every word of `text`, offsets into `text`."""
    starts, ends = word_boundaries(text)
    return [(int(s), int(e), normalize_word(text[s:e])) for s, e in zip(starts, ends, strict=True)]


def words(text: str) -> list[str]:
    """The normalized words of `text`, in order."""
    return [normalize_word(m.group()) for m in WORD_PATTERN.finditer(text)]

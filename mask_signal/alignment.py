"""Which word each token belongs to: the one rule that the build, `update`/`watch`, the trainer's
whole-word masking and the fine-tuning tokenization share.

A token belongs to the word (`maskstream.mask_signal.words`) that its characters overlap, found from the
tokenizer's character offsets into the original text. Overlap, not "the span holding the
token's first character", because Metaspace (SentencePiece: XLM-R, T5, ALBERT, DeBERTa-v3,
Llama) and untrimmed byte-level BPE offsets start at the space before the word (`▁calls` covers
" calls"): whitespace is never part of a word, so the attached space or `▁` overlaps nothing and
needs no special case. Matching is by position in the original text, so the tokenizer's own
normalization (lower-casing, accent stripping, NFKC) does not change which word a token gets.

- A token that overlaps no word (a lone `▁`, punctuation, a space, a zero-width token such as
  the trimmed `Ġ` of a byte-level tokenizer) belongs to none: it is an occurrence of its own with no word (`span` -1), which the mask
  probabilities give the baseline.
- A token that overlaps two or more words (a piece such as `e.g` or `86_64` across a word
  boundary; SentencePiece-trained vocabularies rarely hold one) is counted (`across`) and
  belongs to the word holding most of its characters (the first on a tie), and the words it
  touches become one occurrence: no token is shared, a window never cuts between them, and
  whole-word masking masks them together (a token cannot be half masked).

The tokenizer's own `word_ids()` is not used: it numbers its pre-tokenizer's pieces (whitespace
runs for Metaspace, so `e.g.` or `foo-bar` is one "word"; `'s` separate for byte-level BPE),
which are not the words the statistics counted.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.mask_signal.words import normalize_word, word_boundaries


class Alignment(NamedTuple):
    occurrence: np.ndarray  # int32 per token: occurrence id, from 0 within each document
    span: np.ndarray  # int32 per token: index of its word span, -1 for none
    across: int  # tokens that overlap two or more words


def align_tokens_to_words(
    token_starts: np.ndarray,
    token_ends: np.ndarray,
    span_starts: np.ndarray,
    span_ends: np.ndarray,
    document_starts: np.ndarray | None = None,
) -> Alignment:
    """Each token's word span and occurrence id, vectorized over many documents.

    Spans are sorted, disjoint [start, end) character offsets; token offsets are in the same
    text (documents joined). Consecutive tokens of one word (or of words joined by a token
    across them) share an occurrence id; every token outside all words is an occurrence of its
    own. Occurrence ids restart from 0 at each of `document_starts` (token positions; default:
    one document).
    """
    token_starts = np.asarray(token_starts, np.int64)
    token_ends = np.asarray(token_ends, np.int64)
    span_starts = np.asarray(span_starts, np.int64)
    span_ends = np.asarray(span_ends, np.int64)
    n = len(token_starts)
    if n == 0:
        return Alignment(np.zeros(0, np.int32), np.zeros(0, np.int32), 0)
    # Overlapped spans are first..last: the first span ending after the token starts, the last
    # starting before it ends; a zero-width token overlaps nothing.
    first = np.searchsorted(span_ends, token_starts, side="right")
    last = np.searchsorted(span_starts, token_ends, side="left") - 1
    inside = (first <= last) & (token_ends > token_starts)
    span = np.where(inside, first, -1)
    key = span
    crossing = np.flatnonzero(inside & (last > first))
    if len(crossing):
        for t in crossing:  # rare: a Python loop over these tokens only
            k = np.arange(first[t], last[t] + 1)
            covered = np.minimum(token_ends[t], span_ends[k]) - np.maximum(token_starts[t], span_starts[k])
            span[t] = k[np.argmax(covered)]
        # Spans first..last of a crossing token form one group: span k is joined to k + 1.
        steps = np.zeros(len(span_starts) + 1, np.int64)
        np.add.at(steps, first[crossing], 1)
        np.add.at(steps, last[crossing], -1)
        joined = np.cumsum(steps)[:-1] > 0
        group = np.concatenate([[0], np.cumsum(~joined[:-1])])
        key = np.where(inside, group[np.maximum(span, 0)], -1)
    # A unit is a word (group), or one outside token (negative keys never collide with groups).
    unit = np.where(inside, key, -1 - np.arange(n))
    new = np.ones(n, bool)
    new[1:] = unit[1:] != unit[:-1]
    starts = np.zeros(1, np.int64) if document_starts is None else np.asarray(document_starts, np.int64)
    new[starts[starts < n]] = True
    occurrence = np.cumsum(new) - 1
    lengths = np.diff(np.append(starts, n))
    occurrence -= np.repeat(occurrence[np.minimum(starts, n - 1)], lengths)
    return Alignment(occurrence.astype(np.int32), span.astype(np.int32), len(crossing))


def word_ids_of_text(text: str, offsets: np.ndarray, special_tokens_mask: np.ndarray) -> np.ndarray:
    """Occurrence id per token of one encoded text (-1 for special tokens), by the same rule:
    for callers that tokenize with the Hugging Face tokenizer itself (fine-tuning)."""
    offsets = np.asarray(offsets, np.int64).reshape(-1, 2)
    keep = np.asarray(special_tokens_mask) == 0
    word_ids = np.full(len(offsets), -1, np.int32)
    starts, ends = word_boundaries(text)
    word_ids[keep] = align_tokens_to_words(offsets[keep, 0], offsets[keep, 1], starts, ends).occurrence
    return word_ids


def word_spans_of_text(text: str, vocabulary: WordLookup) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, word-table row or -1) of every word of `text` (`maskstream.mask_signal.words`).

    The words are cut out of the text's UTF-8 bytes as one Arrow array and dictionary-encoded,
    so only each distinct spelling is normalized and hashed in Python, then looked up in the
    vocabulary's sorted hashes at once."""
    starts, ends = word_boundaries(text)
    if len(starts) == 0:
        return starts, ends, np.zeros(0, np.int32)
    data = text.encode("utf-8", "surrogatepass")  # lone surrogates survive a JSON reader
    bounds = np.empty(2 * len(starts), np.int64)
    bounds[0::2], bounds[1::2] = starts, ends
    if len(data) != len(text):  # not ASCII: string index -> byte offset (a character starts at every non-continuation byte)
        character_starts = np.flatnonzero((np.frombuffer(data, np.uint8) & 0xC0) != 0x80)
        bounds = np.append(character_starts, len(data))[bounds]
    # Pieces word, gap, word, ..., word over the bytes, without copying them; keep the words.
    pieces = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)])
    spellings = pc.dictionary_encode(pieces.take(pa.array(np.arange(0, len(bounds) - 1, 2))))
    distinct = spellings.dictionary.to_pylist()
    row_of = vocabulary.index_of([normalize_word(s.decode("utf-8", "surrogatepass")) for s in distinct])
    return starts, ends, row_of[spellings.indices.to_numpy()]


def encoding_arrays(encodings: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens per encoding, int32 ids, [tokens, 2] int64 character offsets) of a batch of
    `tokenizers.Encoding`s, flat: the one conversion of the tokenizer's output every token pays
    (`benchmarks/build.py` times it as the build's floor)."""
    ids = [e.ids for e in encodings]
    counts = np.fromiter(map(len, ids), np.int64, len(ids))
    total = int(counts.sum())
    chain = itertools.chain.from_iterable
    flat_ids = np.fromiter(chain(ids), np.int32, total)
    # (start, end) pairs flattened at C speed.
    pairs = np.fromiter(chain(chain(e.offsets for e in encodings)), np.int64, 2 * total).reshape(-1, 2)
    return counts, flat_ids, pairs


def token_words(texts: Sequence[str], counts: np.ndarray, pairs: np.ndarray,
                vocabulary: WordLookup) -> tuple[np.ndarray, np.ndarray, int]:
    """(occurrence id, word-table row or -1, tokens across two or more words) of every token of a batch
    of texts, flat: `counts[i]` tokens of text i, `pairs` their [tokens, 2] character offsets into
    their own text (no special tokens). Occurrence ids restart from 0 in each text. The one word rule
    of the build, `update` and `MaskMap` (`maskstream.mask_signal.alignment`)."""
    counts = np.asarray(counts, np.int64)
    # Character offsets into the texts joined by "\n" (never part of a word).
    bases = np.concatenate([[0], np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)) + 1)])[:-1]
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2) + np.repeat(bases, counts)[:, None]
    span_starts, span_ends, span_rows = word_spans_of_text("\n".join(texts), vocabulary)
    firsts = np.concatenate([[0], np.cumsum(counts[counts > 0])])[:-1]
    occurrence, span, across = align_tokens_to_words(pairs[:, 0], pairs[:, 1], span_starts, span_ends, firsts)
    word_index = np.where(span >= 0, span_rows[np.maximum(span, 0)] if len(span_rows) else -1, -1)
    return occurrence, word_index.astype(np.int32), across

"""Tokenize documents and cut them into training sequences, with a word id per token.

The word behind a token is found from the tokenizer's character offsets against
`schemas.words.word_spans` of the same text, so it is exactly the word the statistics counted:
a token belongs to the word whose span holds the token's first character. All subword tokens of
one word share its occurrence id; a token outside every word (punctuation) is an occurrence of
its own; special tokens get -1.

Sequences (`--packing`):
- `truncate`: each document is cut into consecutive windows of at most `max_length` tokens
  (specials included), so a long document becomes several sequences and nothing is lost;
- `pack`: documents are concatenated, separated by the tokenizer's end-of-sequence token (BERT
  `[SEP]`, RoBERTa `</s>`), and cut into full sequences (RoBERTa's FULL-SENTENCES); to stay
  deterministic and parallel, documents are packed within groups of about `pack_group_size`
  documents (by a stable hash of the document id), in document-id order.

A window never ends inside a word unless that word alone is longer than a window.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np

from schemas.words import word_spans


class TokenizedDocument(NamedTuple):
    document_id: str
    input_ids: np.ndarray  # int32, no special tokens
    word_ids: np.ndarray  # int32 occurrence index within the document
    word_index: np.ndarray  # int32 word-table row, -1 for punctuation / unknown words


class Window(NamedTuple):
    """A sequence before its global `sequence_id` and mask probabilities are known."""

    unit: str  # sort key of the document (truncate) or packing group (pack) it came from
    window_index: int  # position of the window within its unit
    document_id: str  # the first document in the window
    input_ids: np.ndarray
    word_ids: np.ndarray
    word_index: np.ndarray
    special_tokens_mask: np.ndarray


def align_tokens_to_words(
    token_starts: np.ndarray, spans: Sequence[tuple[int, int, str]]
) -> tuple[np.ndarray, np.ndarray]:
    """(occurrence id per token, index into `spans` per token or -1), vectorized.

    A token belongs to the span holding its first character; consecutive tokens of one span
    share an occurrence id; every token outside all spans is an occurrence of its own.
    """
    n = len(token_starts)
    if n == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    starts = np.fromiter((s for s, _, _ in spans), np.int64, len(spans))
    ends = np.fromiter((e for _, e, _ in spans), np.int64, len(spans))
    span = np.searchsorted(starts, token_starts, side="right") - 1
    inside = (span >= 0) & (token_starts < ends[np.maximum(span, 0)]) if len(spans) else np.zeros(n, bool)
    span = np.where(inside, span, -1)
    # A unit is a span, or one outside token (negative keys never collide with span indices).
    unit = np.where(inside, span, -1 - np.arange(n))
    new = np.ones(n, bool)
    new[1:] = unit[1:] != unit[:-1]
    return (np.cumsum(new) - 1).astype(np.int32), span.astype(np.int32)


class TokenizeDocuments(beam.DoFn):
    """Batches of documents -> TokenizedDocument (HF fast tokenizer, loaded once per DoFn)."""

    def __init__(self, tokenizer_name: str):
        self._tokenizer_name = tokenizer_name
        self._documents = beam.metrics.Metrics.counter("build", "documents_tokenized")
        self._empty = beam.metrics.Metrics.counter("build", "documents_without_tokens")
        self._tokens = beam.metrics.Metrics.counter("build", "tokens")
        self._ms = beam.metrics.Metrics.counter("build", "tokenize_ms")

    def setup(self) -> None:
        self._tokenizer = load_backend_tokenizer(self._tokenizer_name)

    def process(self, batch: Sequence[Any], vocabulary: dict[str, int]) -> Iterator[Any]:
        started = time.perf_counter()
        texts = [d.text for d in batch]
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        for document, encoding in zip(batch, encodings, strict=True):
            ids = np.asarray(encoding.ids, np.int32)
            if len(ids) == 0:
                self._empty.inc()
                yield beam.pvalue.TaggedOutput(
                    "rejects",
                    {"source": document.source, "location": document.document_id, "reason": "no tokens"},
                )
                continue
            spans = word_spans(document.text)
            starts = np.fromiter((s for s, _ in encoding.offsets), np.int64, len(ids))
            occurrence, span = align_tokens_to_words(starts, spans)
            span_word_index = np.fromiter((vocabulary.get(w, -1) for _, _, w in spans), np.int32, len(spans))
            word_index = np.where(span >= 0, span_word_index[np.maximum(span, 0)] if len(spans) else -1, -1)
            self._documents.inc()
            self._tokens.inc(len(ids))
            yield TokenizedDocument(document.document_id, ids, occurrence, word_index.astype(np.int32))
        self._ms.inc(int((time.perf_counter() - started) * 1000))


def load_backend_tokenizer(name: str):
    """The fast tokenizer's Rust backend, without the padding/truncation its config may carry."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(name)
    if not hf.is_fast:
        raise ValueError(f"{name}: maskstream needs a fast (Rust) tokenizer for offsets")
    backend = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    return backend


def special_template(tokenizer) -> tuple[list[int], list[int]]:
    """(prefix ids, suffix ids) the tokenizer puts around one sequence, e.g. [CLS] / [SEP]."""
    encoding = tokenizer.encode("a", add_special_tokens=True)
    mask = encoding.special_tokens_mask
    first = mask.index(0)
    last = len(mask) - 1 - mask[::-1].index(0)
    return list(encoding.ids[:first]), list(encoding.ids[last + 1 :])


def cut_points(word_ids: np.ndarray, capacity: int) -> list[int]:
    """Start offsets of consecutive windows of at most `capacity` tokens, moving each cut back to
    the start of the word it would split (unless that word fills the whole window)."""
    n = len(word_ids)
    cuts = [0]
    while n - cuts[-1] > capacity:
        cut = cuts[-1] + capacity
        back = cut
        while back > cuts[-1] and word_ids[back] >= 0 and word_ids[back] == word_ids[back - 1]:
            back -= 1
        cuts.append(back if back > cuts[-1] else cut)
    return cuts


def make_windows(
    unit: str,
    stream: Sequence[TokenizedDocument],
    separator: Sequence[int],
    prefix: Sequence[int],
    suffix: Sequence[int],
    max_length: int,
) -> Iterator[Window]:
    """Concatenates `stream` (documents separated by `separator`) and cuts it into windows,
    each wrapped in `prefix`/`suffix`; word ids are renumbered from 0 within each window."""
    ids, occ, index, special, doc = [], [], [], [], []
    offset = 0
    for position, document in enumerate(stream):
        if position and separator:
            ids.append(np.asarray(separator, np.int32))
            occ.append(np.full(len(separator), -1, np.int32))
            index.append(np.full(len(separator), -1, np.int32))
            special.append(np.ones(len(separator), np.int8))
            doc.append(np.full(len(separator), position, np.int32))
        ids.append(document.input_ids)
        occ.append(document.word_ids + offset)
        offset += int(document.word_ids.max(initial=-1)) + 1
        index.append(document.word_index)
        special.append(np.zeros(len(document.input_ids), np.int8))
        doc.append(np.full(len(document.input_ids), position, np.int32))
    ids, occ, index, special, doc = (np.concatenate(a) for a in (ids, occ, index, special, doc))
    capacity = max_length - len(prefix) - len(suffix)
    if capacity < 1:
        raise ValueError(f"max_length {max_length} leaves no room for tokens between the special tokens")
    cuts = cut_points(occ, capacity)
    bounds = [*cuts, len(ids)]
    pre, suf = np.asarray(prefix, np.int32), np.asarray(suffix, np.int32)
    n_pre, n_suf = len(pre), len(suf)
    for window_index, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        # A separator at either edge of a window adds nothing: the prefix/suffix are there.
        while start < end and special[start]:
            start += 1
        while end > start and special[end - 1]:
            end -= 1
        if start == end:
            continue
        body_occ = occ[start:end]
        # Renumber occurrences densely from 0 (separators stay -1).
        is_word = body_occ >= 0
        new = np.zeros(end - start, bool)
        new[is_word] = True
        new[1:] &= body_occ[1:] != body_occ[:-1]
        renumbered = np.where(is_word, np.cumsum(new) - 1, -1).astype(np.int32)
        yield Window(
            unit=unit,
            window_index=window_index,
            document_id=stream[int(doc[start])].document_id,
            input_ids=np.concatenate([pre, ids[start:end], suf]),
            word_ids=np.concatenate([np.full(n_pre, -1, np.int32), renumbered, np.full(n_suf, -1, np.int32)]),
            word_index=np.concatenate([np.full(n_pre, -1, np.int32), index[start:end], np.full(n_suf, -1, np.int32)]),
            special_tokens_mask=np.concatenate(
                [np.ones(n_pre, np.int8), special[start:end], np.ones(n_suf, np.int8)]
            ),
        )


def natural_key(name: str) -> tuple:
    """Sort key that orders "x:line 2" before "x:line 10"."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def pack_group(document_id: str, groups: int) -> str:
    """A stable packing group for a document (independent of workers and of Python's hash seed)."""
    digest = hashlib.sha1(document_id.encode("utf-8")).digest()
    return f"pack-{int.from_bytes(digest[:8], 'big') % max(groups, 1):06d}"


class _WindowDocuments(beam.DoFn):
    def __init__(self, tokenizer_name: str, max_length: int):
        self._tokenizer_name = tokenizer_name
        self._max_length = max_length
        self._ms = beam.metrics.Metrics.counter("build", "windows_ms")

    def setup(self) -> None:
        self._prefix, self._suffix = special_template(load_backend_tokenizer(self._tokenizer_name))

    def process(self, element: Any) -> Iterable[Window]:
        started = time.perf_counter()
        if isinstance(element, TokenizedDocument):  # truncate: one document is one unit
            windows = make_windows(element.document_id, [element], [], self._prefix, self._suffix, self._max_length)
        else:  # pack: a group, concatenated in document-id order
            unit, documents = element
            documents = sorted(documents, key=lambda d: natural_key(d.document_id))
            windows = make_windows(unit, documents, self._suffix[-1:], self._prefix, self._suffix, self._max_length)
        yield from list(windows)
        self._ms.inc(int((time.perf_counter() - started) * 1000))


class TokenizeToWindows(beam.PTransform):
    """Documents -> {"windows": Window, "rejects": dict} (documents that yield no token)."""

    def __init__(
        self,
        tokenizer_name: str,
        vocabulary,
        *,
        max_length: int = 128,
        packing: str = "truncate",
        pack_group_size: int = 2000,
        batch_size: int = 256,
    ):
        super().__init__()
        if packing not in ("truncate", "pack"):
            raise ValueError(f"packing must be 'truncate' or 'pack', got {packing!r}")
        self._tokenizer_name = tokenizer_name
        self._vocabulary = vocabulary
        self._max_length = max_length
        self._packing = packing
        self._pack_group_size = pack_group_size
        self._batch_size = batch_size

    def expand(self, documents):
        tokenized = (
            documents
            | "BatchDocuments" >> beam.BatchElements(min_batch_size=8, max_batch_size=self._batch_size)
            | "Tokenize"
            >> beam.ParDo(TokenizeDocuments(self._tokenizer_name), self._vocabulary).with_outputs(
                "rejects", main="documents"
            )
        )
        units = tokenized.documents
        if self._packing == "pack":
            count = documents | "CountDocuments" >> beam.combiners.Count.Globally()
            group_size = self._pack_group_size
            units = (
                units
                | "KeyByPackGroup"
                >> beam.Map(
                    lambda d, n: (pack_group(d.document_id, -(-n // group_size)), d),
                    n=beam.pvalue.AsSingleton(count),
                )
                | "GroupForPacking" >> beam.GroupByKey()
            )
        windows = units | "CutWindows" >> beam.ParDo(_WindowDocuments(self._tokenizer_name, self._max_length))
        return {"windows": windows, "rejects": tokenized.rejects}

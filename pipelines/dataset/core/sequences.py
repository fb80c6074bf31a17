"""Tokenize documents and cut them into training sequences, with a word id per token.

Everything here works on batches, as Arrow tables of flat arrays (no per-token Python):

- `tokenize_documents`: a batch of documents -> TOKENIZED_SCHEMA (token ids, a word occurrence
  id and a word-table row per token, no special tokens).
- `cut_windows`: tokenized documents -> WINDOWS_SCHEMA, sequences of at most `max_length`
  tokens wrapped in the tokenizer's special tokens, before their global `sequence_id` and mask
  probabilities are known.

The word behind a token is found from the tokenizer's character offsets against the words of
`maskstream.mask_signal.words` in the same text, so it is exactly the word the statistics counted: a token
belongs to the word its characters overlap (`maskstream.mask_signal.alignment`, the rule every path shares).
All subword tokens of one word share its occurrence id; a token outside every word (punctuation,
a lone `▁`) is an occurrence of its own; special tokens get -1.

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

import dataclasses
import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from maskstream.mask_signal.alignment import encoding_arrays, token_words
from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.pipelines.dataset.core.tokenizer_facts import (
    load_backend_tokenizer,
    pack_separator,
    special_template,
)

TOKENIZED_SCHEMA = pa.schema([
    pa.field("document_id", pa.string()),
    pa.field("input_ids", pa.list_(pa.int32())),  # no special tokens
    pa.field("word_ids", pa.list_(pa.int32())),  # word occurrence within the document, from 0
    pa.field("word_index", pa.list_(pa.int32())),  # word-table row; -1 for punctuation, unknown words
])

WINDOWS_SCHEMA = pa.schema([
    pa.field("unit", pa.string()),  # the document (truncate) or packing group (pack) it came from
    pa.field("window_index", pa.int32()),  # position of the window within its unit
    pa.field("document_id", pa.string()),  # the first document in the window
    pa.field("input_ids", pa.list_(pa.int32())),
    pa.field("word_ids", pa.list_(pa.int32())),
    pa.field("word_index", pa.list_(pa.int32())),
    pa.field("special_tokens_mask", pa.list_(pa.int8())),
])


def list_column(values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type))


def flat(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list column, offsets from 0 (slices and chunks are combined)."""
    column = table.column(name).combine_chunks()
    if isinstance(column, pa.ChunkedArray):  # an empty table
        column = pa.array([], column.type)
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return values, offsets - offsets[0]


def tokenize_documents(tokenizer, documents: Sequence[Any],
                       vocabulary: WordLookup) -> tuple[pa.Table, list, int]:
    """(TOKENIZED_SCHEMA table of the documents with tokens, the documents without any token,
    the number of tokens across two or more words (`maskstream.mask_signal.alignment`)).

    `tokenizer` is a `tokenizers.Tokenizer` (see `tokenizer_facts.load_backend_tokenizer`); `word_index` is the
    word's row in `vocabulary`, -1 outside words and for words it does not hold.
    """
    texts = [d.text for d in documents]
    counts, ids, pairs = encoding_arrays(tokenizer.encode_batch(texts, add_special_tokens=False))
    keep = counts > 0
    occurrence, word_index, across = token_words(texts, counts, pairs, vocabulary)
    offsets = np.concatenate([[0], np.cumsum(counts[keep])])
    table = pa.table({
        "document_id": pa.array([d.document_id for d, k in zip(documents, keep, strict=True) if k], pa.string()),
        "input_ids": list_column(ids, offsets, pa.int32()),
        "word_ids": list_column(occurrence, offsets, pa.int32()),
        "word_index": list_column(word_index.astype(np.int32), offsets, pa.int32()),
    }, schema=TOKENIZED_SCHEMA)
    return table, [d for d, k in zip(documents, keep, strict=True) if not k], across


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


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, e) for each pair, vectorized."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return first + np.arange(total)


def cut_windows(
    streams: pa.Table,
    prefix: Sequence[int],
    suffix: Sequence[int],
    max_length: int,
    special_tokens_mask: np.ndarray | None = None,
    document_ids: Sequence[str] | None = None,
    document_of_token: np.ndarray | None = None,
) -> pa.Table:
    """Token streams -> WINDOWS_SCHEMA: each stream cut into windows of at most `max_length`
    tokens with `prefix`/`suffix` around each; word ids renumbered from 0 within each window.

    `streams` has TOKENIZED_SCHEMA's columns; its `document_id` names the unit. A stream is one
    document (truncate), or several joined by separator tokens (pack): then
    `special_tokens_mask` marks the separators (flat, 1 = special), `document_of_token` gives
    each token's document in `document_ids`; separators at a window's edge are dropped.
    """
    capacity = max_length - len(prefix) - len(suffix)
    if capacity < 1:
        raise ValueError(f"max_length {max_length} leaves no room for tokens between the special tokens")
    ids, offsets = flat(streams, "input_ids")
    occurrence, _ = flat(streams, "word_ids")
    word_index, _ = flat(streams, "word_index")
    special = np.zeros(len(ids), np.int8) if special_tokens_mask is None else special_tokens_mask
    units = streams.column("document_id").to_pylist()
    lengths = np.diff(offsets)

    # Window bounds: one window for a stream that fits, else cut at word starts.
    window_unit, window_start, window_end, window_index = [], [], [], []
    for u in np.flatnonzero(lengths > capacity):
        base = int(offsets[u])
        bounds = [*cut_points(occurrence[base : int(offsets[u + 1])], capacity), int(lengths[u])]
        window_unit.extend([u] * (len(bounds) - 1))
        window_start.extend(base + b for b in bounds[:-1])
        window_end.extend(base + b for b in bounds[1:])
        window_index.extend(range(len(bounds) - 1))
    short = np.flatnonzero(lengths <= capacity)
    window_unit = np.concatenate([short, np.asarray(window_unit, np.int64)])
    window_start = np.concatenate([offsets[short], np.asarray(window_start, np.int64)])
    window_end = np.concatenate([offsets[short + 1], np.asarray(window_end, np.int64)])
    window_index = np.concatenate([np.zeros(len(short), np.int64), np.asarray(window_index, np.int64)])
    order = np.lexsort((window_index, window_unit))
    window_unit, window_start, window_end, window_index = (
        a[order] for a in (window_unit, window_start, window_end, window_index))
    if special_tokens_mask is not None:  # a separator at either edge adds nothing: the prefix/suffix are there
        for w in range(len(window_start)):
            while window_start[w] < window_end[w] and special[window_start[w]]:
                window_start[w] += 1
            while window_end[w] > window_start[w] and special[window_end[w] - 1]:
                window_end[w] -= 1
        nonempty = window_end > window_start
        window_unit, window_start, window_end, window_index = (
            a[nonempty] for a in (window_unit, window_start, window_end, window_index))

    # Assemble: prefix, body, suffix per window, all windows at once.
    n_pre, n_suf = len(prefix), len(suffix)
    body_lengths = window_end - window_start
    out_offsets = np.concatenate([[0], np.cumsum(body_lengths + n_pre + n_suf)])
    body = _ranges(window_start, window_end)  # token positions in the streams
    window_of_body = np.repeat(np.arange(len(window_start)), body_lengths)
    position = out_offsets[:-1][window_of_body] + n_pre + (body - np.repeat(window_start, body_lengths))
    total = int(out_offsets[-1])
    out_ids = np.empty(total, np.int32)
    out_word_ids = np.full(total, -1, np.int32)
    out_word_index = np.full(total, -1, np.int32)
    out_special = np.ones(total, np.int8)
    for k, token in enumerate(prefix):
        out_ids[out_offsets[:-1] + k] = token
    for k, token in enumerate(suffix):
        out_ids[out_offsets[1:] - n_suf + k] = token
    out_ids[position] = ids[body]
    body_occurrence = occurrence[body]
    first_occurrence = np.repeat(occurrence[window_start] if len(window_start) else np.zeros(0, np.int32),
                                 body_lengths)
    out_word_ids[position] = np.where(body_occurrence >= 0, body_occurrence - first_occurrence, -1)
    out_word_index[position] = word_index[body]
    out_special[position] = special[body]
    if document_ids is None:
        first_document = [units[u] for u in window_unit]
    else:
        first_document = [document_ids[d] for d in document_of_token[window_start]]
    return pa.table({
        "unit": pa.array([units[u] for u in window_unit], pa.string()),
        "window_index": pa.array(window_index.astype(np.int32), pa.int32()),
        "document_id": pa.array(first_document, pa.string()),
        "input_ids": list_column(out_ids, out_offsets, pa.int32()),
        "word_ids": list_column(out_word_ids, out_offsets, pa.int32()),
        "word_index": list_column(out_word_index, out_offsets, pa.int32()),
        "special_tokens_mask": list_column(out_special, out_offsets, pa.int8()),
    }, schema=WINDOWS_SCHEMA)


def pack_documents(unit: str, documents: pa.Table, separator: Sequence[int], prefix: Sequence[int],
                   suffix: Sequence[int], max_length: int) -> pa.Table:
    """TOKENIZED_SCHEMA documents, in order -> the windows of their concatenation (pack mode);
    word occurrence ids run on across documents, separators are special tokens."""
    ids, offsets = flat(documents, "input_ids")
    occurrence, _ = flat(documents, "word_ids")
    word_index, _ = flat(documents, "word_index")
    n_docs, n_sep = documents.num_rows, len(separator)
    lengths = np.diff(offsets)
    # Each document after the first is preceded by the separator.
    starts = offsets[:-1] + np.arange(n_docs) * n_sep
    total = int(lengths.sum()) + max(n_docs - 1, 0) * n_sep
    stream_ids = np.empty(total, np.int32)
    stream_occurrence = np.full(total, -1, np.int32)
    stream_index = np.full(total, -1, np.int32)
    special = np.ones(total, np.int8)
    document_of_token = np.zeros(total, np.int64)
    for k, token in enumerate(separator):
        stream_ids[starts[1:] - n_sep + k] = token
        document_of_token[starts[1:] - n_sep + k] = np.arange(1, n_docs)
    body = _ranges(starts, starts + lengths)
    # Occurrences continue across documents: each document's ids shifted past the previous ones.
    per_doc = np.zeros(n_docs, np.int64)
    if len(occurrence):
        nonempty = lengths > 0
        last = np.where(nonempty, occurrence[np.maximum(offsets[1:] - 1, 0)].astype(np.int64) + 1, 0)
        per_doc = np.concatenate([[0], np.cumsum(last)[:-1]])
    stream_ids[body] = ids
    stream_occurrence[body] = occurrence + np.repeat(per_doc, lengths)
    stream_index[body] = word_index
    special[body] = 0
    document_of_token[body] = np.repeat(np.arange(n_docs), lengths)
    stream = pa.table({
        "document_id": pa.array([unit], pa.string()),
        "input_ids": list_column(stream_ids, np.array([0, total]), pa.int32()),
        "word_ids": list_column(stream_occurrence, np.array([0, total]), pa.int32()),
        "word_index": list_column(stream_index, np.array([0, total]), pa.int32()),
    }, schema=TOKENIZED_SCHEMA)
    return cut_windows(stream, prefix, suffix, max_length, special_tokens_mask=special,
                       document_ids=documents.column("document_id").to_pylist(), document_of_token=document_of_token)


def natural_key(name: str) -> tuple:
    """Sort key that orders "x:line 2" before "x:line 10"."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def sort_documents(documents: pa.Table) -> pa.Table:
    """Rows in natural document-id order (ties, e.g. "f01:line 1" and "f1:line 1", by name)."""
    ids = documents.column("document_id").to_pylist()
    return documents.take(sorted(range(len(ids)), key=lambda i: (natural_key(ids[i]), ids[i])))


def pack_group(document_id: str, groups: int) -> str:
    """A stable packing group for a document (independent of workers and of Python's hash seed)."""
    digest = hashlib.sha1(document_id.encode("utf-8")).digest()
    return f"pack-{int.from_bytes(digest[:8], 'big') % max(groups, 1):06d}"


def split_by_pack_group(table: pa.Table, documents: int, group_size: int) -> Iterator[tuple[str, pa.Table]]:
    """Tokenized documents -> (packing group, its rows), about `group_size` documents a group over a
    corpus of `documents` (every document read, those without tokens too)."""
    groups = [pack_group(d, -(-documents // group_size)) for d in table.column("document_id").to_pylist()]
    by_group: dict[str, list[int]] = {}
    for row, group in enumerate(groups):
        by_group.setdefault(group, []).append(row)
    for group, rows in by_group.items():
        yield group, table.take(rows)


@dataclasses.dataclass(frozen=True)
class WindowTemplate:
    """What a tokenizer puts around a window (`prefix`, `suffix`) and between packed documents."""

    prefix: Sequence[int]
    suffix: Sequence[int]
    separator: Sequence[int]


def window_template(tokenizer_name: str) -> WindowTemplate:
    """The specials around a window of a tokenizer, and its separator between packed documents."""
    prefix, suffix = special_template(load_backend_tokenizer(tokenizer_name))
    return WindowTemplate(prefix, suffix, pack_separator(tokenizer_name))


def windows(tokenized: pa.Table, unit: str, template: WindowTemplate, max_length: int, packing: str) -> pa.Table:
    """The one windowing rule of `build` and `update`: TOKENIZED_SCHEMA documents -> WINDOWS_SCHEMA.

    `truncate`: every document cut on its own (`unit` unused: each document is its own unit);
    `pack`: the documents of one packing group `unit` (split_by_pack_group), in document-id order.
    """
    if packing == "pack":
        return pack_documents(unit, sort_documents(tokenized), template.separator, template.prefix,
                              template.suffix, max_length)
    return cut_windows(tokenized, template.prefix, template.suffix, max_length)

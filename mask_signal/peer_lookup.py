"""The peers' signals of a dataset version, joined to its rows by the shards' `word_index` column
(`maskstream build --peer-signals` writes them; pipelines/statistics/peer_formulas.py has the formulas).

- `span_ids`: PMI-Masking's units, numbered like `word_ids` (0, 1, 2, ... in order; specials -1): the
  words of a collocation the sequence holds share one id; every other word occurrence and every
  punctuation token is its own unit. Collocations are matched on consecutive word occurrences,
  longest first, then leftmost, never overlapping. A punctuation token, a word the word table lacks
  and a special token (a packed window's document separator) end a match, as punctuation and line
  breaks end the phrases the counts are made of. (A line break alone leaves no token, so a match can
  cross one the counts did not.)
- `informativeness`: InforMask's per-word mask weight (`mask_weight`), at each of the word's tokens;
  0 for specials, punctuation and words the word table lacks.

No torch: the loader's workers call it on each row (numpy); n-grams are matched by a 64-bit hash of
their word_index tuple (a false match needs two of ~1e5 n-grams to collide in 2^64).
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Sequence

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from maskstream.schemas.manifest import Manifest, safe_relative_path
from maskstream.storage.retry import retry_read

PEER_COLUMNS = ("span_ids", "informativeness")  # what the loader can add to a sample
FILTER_BITS = 18
_PRIME = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime
_OFFSET = np.uint64(0xCBF29CE484222325)


def hash_rows(words: np.ndarray) -> np.ndarray:
    """The 64-bit key of each row of a [rows, n] matrix of word_index (FNV-1a over word_index + 1)."""
    keys = np.full(len(words), _OFFSET, np.uint64)
    with np.errstate(over="ignore"):
        for column in np.asarray(words, np.int64).T:
            keys = (keys ^ (column.astype(np.uint64) + np.uint64(1))) * _PRIME
    return keys


def ngram_keys(word_index: np.ndarray, n: int) -> np.ndarray:
    """The key of every run of `n` consecutive entries of `word_index` (len - n + 1 keys)."""
    word_index = np.asarray(word_index, np.int64)
    if len(word_index) < n:
        return np.zeros(0, np.uint64)
    return hash_rows(np.lib.stride_tricks.sliding_window_view(word_index, n))


class PeerSignalsMissing(ValueError):
    """The version was built without `--peer-signals`."""


@dataclasses.dataclass(frozen=True)
class PeerSignals:
    """A version's collocations (hashed, by length) and per-word mask weights (by word_index)."""

    collocations: dict[int, np.ndarray]  # n -> sorted uint64 keys
    mask_weight: np.ndarray  # float32, by word_index
    # n -> True at the low FILTER_BITS bits of every key: most keys of a row are no collocation, and one
    # look-up here rules them out before the binary search (a few times cheaper than searching all).
    filters: dict[int, np.ndarray] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        filters = {}
        for n, keys in self.collocations.items():
            filters[n] = np.zeros(1 << FILTER_BITS, bool)
            filters[n][(keys & np.uint64((1 << FILTER_BITS) - 1)).astype(np.int64)] = True
        object.__setattr__(self, "filters", filters)

    @classmethod
    def load(cls, version_url: str, manifest: Manifest) -> PeerSignals:
        """The signals of a dataset version; PeerSignalsMissing for one built without them."""
        if not manifest.peer_signals:
            raise PeerSignalsMissing(
                f"{version_url} has no collocations or informativeness: build it with `maskstream build --peer-signals` "
                "to mask with pmi_span, difference_pmi_span or informask")
        return cls.read(version_url, manifest.peer_signals)

    @classmethod
    def read(cls, folder: str, entry: dict) -> PeerSignals:
        """The signals in `folder` (local or gs://), whose files `entry` names (a manifest's or an exported
        map's `peer_signals`)."""

        def read(name: str, columns: list[str]) -> pa.Table:
            url = posixpath.join(folder, safe_relative_path(name))

            def table() -> pa.Table:
                with fsspec.open(url, "rb") as f:
                    return pq.read_table(f, columns=columns)

            return retry_read(table, url)

        return cls.of_tables(read(entry["collocations"], ["n", "word_index"]),
                             read(entry["informativeness"], ["word_index", "mask_weight"]))

    @classmethod
    def of_tables(cls, collocations: pa.Table, informativeness: pa.Table) -> PeerSignals:
        """From the two tables (COLLOCATION_SCHEMA's `n` and `word_index`, INFORMATIVENESS_SCHEMA's
        `word_index` and `mask_weight`)."""
        words = informativeness.column("word_index").to_numpy()
        if not np.array_equal(np.sort(words), np.arange(len(words))):
            raise ValueError(f"the informativeness table's word_index must run 0..{len(words) - 1}, one row per word "
                             "type of the version's word table; it does not: a table of another word table?")
        lengths = collocations.column("n").to_numpy()
        indices = collocations.column("word_index").combine_chunks()
        flat, offsets = indices.flatten().to_numpy(), indices.offsets.to_numpy()
        if len(flat) and (flat.min() < 0 or flat.max() >= len(words)):
            raise ValueError(f"the collocations table names word_index {int(flat.min())}..{int(flat.max())}, outside the "
                             f"{len(words)} word types of the informativeness table: tables of different word tables?")
        by_length = {}
        for n in np.unique(lengths).tolist():
            rows = np.flatnonzero(lengths == n)
            by_length[int(n)] = np.sort(hash_rows(flat[offsets[rows][:, None] + np.arange(n)[None, :]]))
        weights = informativeness.sort_by("word_index").column("mask_weight").to_numpy()
        return cls(by_length, np.asarray(weights, np.float32))

    def columns(self, word_ids: np.ndarray, word_index: np.ndarray, offsets: np.ndarray,
                names: Sequence[str] = PEER_COLUMNS) -> dict[str, np.ndarray]:
        """The columns `names` (of PEER_COLUMNS) of rows end to end (row r is [offsets[r], offsets[r + 1])),
        flat: what the loader adds to each sample, sliced as the rows are. Only those asked for are
        computed (the units cost most)."""
        compute = {"span_ids": lambda: self.span_ids_of_rows(word_ids, word_index, offsets),
                   "informativeness": lambda: self.token_weights(word_index)}
        return {name: compute[name]() for name in names}

    def span_ids(self, word_ids: np.ndarray, word_index: np.ndarray) -> np.ndarray:
        """One row's PMI-Masking units (module doc), int32 like `word_ids`."""
        return self.span_ids_of_rows(word_ids, word_index, np.array([0, len(word_ids)]))

    def span_ids_of_rows(self, word_ids: np.ndarray, word_index: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """The units of many rows at once: `word_ids` and `word_index` are the rows' tokens end to end, row
        r being [offsets[r], offsets[r + 1]) (the loader passes a window of rows). Array work over all
        the rows; the greedy choice among overlapping matches runs in rounds (`_match`), not per match."""
        word_ids, word_index = np.asarray(word_ids, np.int64), np.asarray(word_index, np.int64)
        offsets = np.asarray(offsets, np.int64)
        rows = len(offsets) - 1
        row_of_token = np.repeat(np.arange(rows), np.diff(offsets))
        in_word = word_ids >= 0  # -1: a special token (or padding)
        # Occurrences numbered across the rows: row r's occurrence k is first[r] + k.
        per_row = np.zeros(rows, np.int64)
        np.maximum.at(per_row, row_of_token[in_word], word_ids[in_word] + 1)
        first = np.concatenate([[0], np.cumsum(per_row)])
        if first[-1] == 0:  # no row holds a word
            return np.full(len(word_ids), -1, np.int32)
        occurrence = np.where(in_word, word_ids + first[row_of_token], -1)
        occurrence_type = np.full(first[-1], -1, np.int64)
        occurrence_type[occurrence[in_word]] = word_index[in_word]  # every token of a word has its word_index
        # Segments: a row's occurrences between two special tokens (and a row's start).
        row_start = np.zeros(len(word_ids), bool)
        row_start[offsets[:-1][np.diff(offsets) > 0]] = True
        segment_of_token = np.cumsum(~in_word | row_start)
        segment = np.zeros(first[-1], np.int64)
        segment[occurrence[in_word]] = segment_of_token[in_word]
        unit = self._match(occurrence_type, segment)
        # Units numbered 0, 1, 2, ... within each row, in order (a unit is named by its first occurrence).
        row_of_occurrence = np.repeat(np.arange(rows), per_row)
        is_start = unit == np.arange(len(unit))
        starts_so_far = np.concatenate([[0], np.cumsum(is_start)])
        dense = starts_so_far[unit] - starts_so_far[first[row_of_occurrence]]
        return np.where(in_word, dense[np.maximum(occurrence, 0)], -1).astype(np.int32)

    def _match(self, types: np.ndarray, segment: np.ndarray) -> np.ndarray:
        """For each occurrence of `types` (word_index end to end, -1 for punctuation and unknown words;
        `segment` numbering the runs between special tokens), the position of the first occurrence of
        its unit: collocations longest first, then leftmost, never overlapping, never over a -1 or
        across segments. The leftmost greedy in rounds: a match with no remaining overlapping match to
        its left is taken, the matches it overlaps drop out, and again (a round per link of a chain)."""
        unit_start = np.arange(len(types))
        covered = np.zeros(len(types), bool)
        not_words = np.concatenate([[0], np.cumsum(types < 0)])
        for n in sorted(self.collocations, reverse=True):
            if len(types) < n:
                continue
            keys = ngram_keys(types, n)
            table = self.collocations[n]
            maybe = np.flatnonzero(self.filters[n][(keys & np.uint64((1 << FILTER_BITS) - 1)).astype(np.int64)])
            at = np.minimum(np.searchsorted(table, keys[maybe]), len(table) - 1)
            candidate = np.zeros(len(keys), bool)
            candidate[maybe[table[at] == keys[maybe]]] = True
            candidate &= (segment[: len(keys)] == segment[n - 1 :]) & (not_words[n:] == not_words[:-n])

            def free(candidate: np.ndarray, n: int = n) -> np.ndarray:
                covered_before = np.concatenate([[0], np.cumsum(covered)])  # a window is free of covered words
                return candidate & (covered_before[n:] == covered_before[:-n])

            candidate = free(candidate)
            while candidate.any():
                left = np.zeros_like(candidate)
                for distance in range(1, n):
                    left[distance:] |= candidate[:-distance]
                taken = np.flatnonzero(candidate & ~left)
                for offset in range(n):
                    covered[taken + offset] = True
                    unit_start[taken + offset] = taken
                candidate = free(candidate)
        return unit_start

    def token_weights(self, word_index: np.ndarray) -> np.ndarray:
        """InforMask's weight of each token (0 outside words), float32: of one row or of rows end to end."""
        word_index = np.asarray(word_index, np.int64)
        known = (word_index >= 0) & (word_index < len(self.mask_weight))
        weights = np.zeros(len(word_index), np.float32)
        weights[known] = self.mask_weight[word_index[known]]
        return weights

"""The peers' signals of a dataset version, joined to its rows by the shards' `word_index` column
(`maskstream build --peer-signals` writes them; pipelines/statistics/collocations.py has the formulas).

- `span_ids`: PMI-Masking's units, numbered like `word_ids` (0, 1, 2, ... in order; specials -1): the
  words of a collocation the sequence holds share one id; every other word occurrence and every
  punctuation token is its own unit. Collocations are matched on the sequence's words (punctuation
  between them skipped, as the counts skip it), longest first, then leftmost, never overlapping.
  The shards do not store sentence ends, so a match may cross one (the counts never do).
- `informativeness`: InforMask's per-word mask weight (`mask_weight`), at each of the word's tokens;
  0 for specials and punctuation.

No torch: the loader's workers call it on each row (numpy); n-grams are matched by a 64-bit hash of
their word_index tuple (a false match needs two of ~1e5 n-grams to collide in 2^64).
"""

from __future__ import annotations

import dataclasses
import posixpath

import numpy as np
import pyarrow.parquet as pq

from maskstream.schemas.manifest import Manifest
from maskstream.storage.retry import retry_read

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

    @classmethod
    def load(cls, version_url: str, manifest: Manifest) -> PeerSignals:
        entry = manifest.peer_signals
        if not entry:
            raise PeerSignalsMissing(
                f"{version_url} has no collocations or informativeness: build it with `maskstream build --peer-signals` "
                "to mask with pmi_span, difference_pmi_span or informask")

        def read(name: str, columns: list[str]):
            return retry_read(lambda: pq.read_table(posixpath.join(version_url, name), columns=columns), version_url)

        table = read(entry["collocations"], ["n", "word_index"])
        lengths = table.column("n").to_numpy()
        indices = table.column("word_index").combine_chunks()
        flat, offsets = indices.flatten().to_numpy(), indices.offsets.to_numpy()
        collocations = {}
        for n in np.unique(lengths).tolist():
            rows = np.flatnonzero(lengths == n)
            words = flat[(offsets[rows][:, None] + np.arange(n)[None, :])]  # [rows, n]
            collocations[int(n)] = np.sort(hash_rows(words))
        weights = read(entry["informativeness"], ["word_index", "mask_weight"]).sort_by("word_index")
        return cls(collocations, weights.column("mask_weight").to_numpy().astype(np.float32))

    def span_ids(self, word_ids: np.ndarray, word_index: np.ndarray) -> np.ndarray:
        """One row's PMI-Masking units (module doc), int32 like `word_ids`."""
        word_ids = np.asarray(word_ids)
        in_word = word_ids >= 0
        if not in_word.any():
            return word_ids.astype(np.int32)
        occurrences, first_token = np.unique(word_ids[in_word], return_index=True)
        occurrence_type = np.full(int(occurrences[-1]) + 1, -1, np.int64)
        occurrence_type[occurrences] = np.asarray(word_index)[in_word][first_token]
        words = np.flatnonzero(occurrence_type >= 0)  # occurrences that are words, in order
        unit = np.arange(len(occurrence_type))
        covered = np.zeros(len(words), bool)
        for n in sorted(self.collocations, reverse=True):
            if len(words) < n:
                continue
            keys = ngram_keys(occurrence_type[words], n)
            table = self.collocations[n]
            at = np.minimum(np.searchsorted(table, keys), len(table) - 1)
            for start in np.flatnonzero(table[at] == keys).tolist():
                if not covered[start : start + n].any():
                    covered[start : start + n] = True
                    unit[words[start : start + n]] = words[start]
        _, dense = np.unique(unit, return_inverse=True)
        return np.where(in_word, dense[np.maximum(word_ids, 0)], -1).astype(np.int32)

    def informativeness(self, word_index: np.ndarray) -> np.ndarray:
        """One row's InforMask weight per token (0 outside words), float32."""
        word_index = np.asarray(word_index)
        return np.where(word_index >= 0, self.mask_weight[np.maximum(word_index, 0)], 0.0).astype(np.float32)

"""Near-duplicates: MinHash LSH (datasketch) proposes, exact Jaccard decides.

Two texts are near-duplicates when the Jaccard similarity of their word-trigram sets is at least
THRESHOLD, either over the whole text or over its first 32 words (descriptions that share a long
boilerplate opening and differ after it). Texts are normalized first (NFKC, case-folded, split on
whitespace). Splits are made by cluster (union-find over near-duplicate pairs), so no validation
or test text has a near-duplicate in train.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Sequence

from datasketch import MinHash, MinHashLSH

THRESHOLD = 0.5
HEAD_WORDS = 32
NUM_PERM = 128


def words(text: str) -> list[str]:
    return unicodedata.normalize("NFKC", text).casefold().split()


def trigrams(tokens: Sequence[str]) -> frozenset[str]:
    """Word trigrams; a text of fewer than three words is its own single shingle."""
    if len(tokens) < 3:
        return frozenset([" ".join(tokens)])
    return frozenset(" ".join(tokens[i:i + 3]) for i in range(len(tokens) - 2))


def views(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(whole-text trigrams, first-HEAD_WORDS-words trigrams)."""
    tokens = words(text)
    return trigrams(tokens), trigrams(tokens[:HEAD_WORDS])


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def near_duplicates(a: str, b: str, threshold: float = THRESHOLD) -> bool:
    """The definition of the module docstring, computed exactly (the reference the tests use)."""
    return any(jaccard(x, y) >= threshold for x, y in zip(views(a), views(b), strict=True))


def _minhash(shingles: Iterable[str]) -> MinHash:
    sketch = MinHash(num_perm=NUM_PERM, seed=1)
    sketch.update_batch([s.encode("utf-8") for s in shingles])
    return sketch


class NearDuplicateIndex:
    """Texts added under keys; `matches(text)` returns the keys of the added near-duplicates of `text`."""

    def __init__(self, threshold: float = THRESHOLD) -> None:
        # LSH with a lower threshold than the decision, so that true pairs near it are rarely missed;
        # every candidate is then checked exactly.
        self.threshold = threshold
        self._lsh = [MinHashLSH(threshold=threshold * 0.7, num_perm=NUM_PERM) for _ in range(2)]
        self._views: dict[str, tuple[frozenset[str], frozenset[str]]] = {}

    def add(self, key: str, text: str) -> None:
        self._views[key] = shingled = views(text)
        for lsh, shingles in zip(self._lsh, shingled, strict=True):
            lsh.insert(key, _minhash(shingles))

    def matches(self, text: str) -> list[str]:
        shingled = views(text)
        candidates: set[str] = set()
        for lsh, shingles in zip(self._lsh, shingled, strict=True):
            candidates.update(lsh.query(_minhash(shingles)))
        return sorted(k for k in candidates
                      if any(jaccard(x, y) >= self.threshold for x, y in zip(shingled, self._views[k], strict=True)))


def clusters(texts: Sequence[str], threshold: float = THRESHOLD) -> list[int]:
    """Cluster id of each text: connected components of the near-duplicate graph."""
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    index = NearDuplicateIndex(threshold)
    for i, text in enumerate(texts):
        for j in index.matches(text):
            parent[root(int(j))] = root(i)
        index.add(str(i), text)
    return [root(i) for i in range(len(texts))]


def cluster_key(texts: Iterable[str]) -> str:
    """A key that depends only on the cluster's contents (not on file order): the smallest member hash."""
    return min(hashlib.sha256(" ".join(words(t)).encode("utf-8")).hexdigest() for t in texts)


def drop_near_duplicates(texts: Sequence[str], held_out: Sequence[str], threshold: float = THRESHOLD
                         ) -> tuple[list[int], int]:
    """(indices of `texts` with no near-duplicate among `held_out`, how many were dropped)."""
    index = NearDuplicateIndex(threshold)
    for i, text in enumerate(held_out):
        index.add(str(i), text)
    kept = [i for i, text in enumerate(texts) if not index.matches(text)]
    return kept, len(texts) - len(kept)


def count_with_near_duplicate(queries: Sequence[str], corpus: Sequence[str], threshold: float = THRESHOLD) -> int:
    """How many of `queries` have at least one near-duplicate in `corpus`."""
    index = NearDuplicateIndex(threshold)
    for i, text in enumerate(corpus):
        index.add(str(i), text)
    return sum(bool(index.matches(q)) for q in queries)

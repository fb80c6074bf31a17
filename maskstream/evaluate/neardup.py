"""Near-duplicates, found exactly: a similarity join with a prefix filter, no sketch.

Two texts are near-duplicates when the Jaccard similarity of their word-trigram sets is at least
THRESHOLD, either over the whole text or over its first HEAD_WORDS words (descriptions that share a
long boilerplate opening and differ after it). Texts are normalized first (NFKC, case-folded, split on
whitespace); a text of fewer than three words is its own single shingle.

Candidates come from the prefix filter of all-pairs similarity joins (Bayardo, Ma and Srikant, WWW
2007): order every shingle by how rare it is in the indexed texts; a pair with Jaccard >= t shares a
shingle among the first |x| - ceil(t |x|) + 1 shingles of each set. The filter drops only pairs that
cannot reach t, so every pair at or above it is found (no MinHash, no false negatives), and each
candidate is decided by its exact Jaccard. tests/test_evaluate.py checks the join against every pair.
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

THRESHOLD = 0.5
HEAD_WORDS = 32


def words(text: str) -> list[str]:
    return unicodedata.normalize("NFKC", text).casefold().split()


def trigrams(tokens: Sequence[str]) -> frozenset[str]:
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
    """The definition of the module docstring for one pair."""
    return any(jaccard(x, y) >= threshold for x, y in zip(views(a), views(b), strict=True))


def _prefix_length(size: int, threshold: float) -> int:
    return size - math.ceil(threshold * size - 1e-12) + 1


class _View:
    """One view (whole text or head) of the indexed texts: sets, shingle ranks and the prefix index."""

    def __init__(self, sets: list[frozenset[str]], threshold: float) -> None:
        self.sets, self.threshold = sets, threshold
        self.frequency = Counter(s for shingles in sets for s in shingles)
        self.index: dict[str, list[int]] = defaultdict(list)
        for i, shingles in enumerate(sets):
            for s in self.prefix(shingles):
                self.index[s].append(i)

    def prefix(self, shingles: frozenset[str]) -> list[str]:
        # one global order: rarest first in the indexed texts (unseen ones first of all), then the text
        ordered = sorted(shingles, key=lambda s: (self.frequency.get(s, 0), s))
        return ordered[:_prefix_length(len(ordered), self.threshold)]

    def matches(self, shingles: frozenset[str]) -> set[int]:
        candidates = {i for s in self.prefix(shingles) for i in self.index.get(s, ())}
        return {i for i in candidates if jaccard(shingles, self.sets[i]) >= self.threshold}


class NearDuplicateIndex:
    """Texts indexed once; `matches(text)` lists the indexed texts that are its near-duplicates."""

    def __init__(self, texts: Sequence[str], threshold: float = THRESHOLD) -> None:
        shingled = [views(t) for t in texts]
        self._views = [_View([v[k] for v in shingled], threshold) for k in range(2)]

    def matches(self, text: str) -> list[int]:
        found: set[int] = set()
        for view, shingles in zip(self._views, views(text), strict=True):
            found |= view.matches(shingles)
        return sorted(found)


def clusters(texts: Sequence[str], threshold: float = THRESHOLD) -> list[int]:
    """Cluster id of each text: connected components of the near-duplicate graph (the smallest member)."""
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    index = NearDuplicateIndex(texts, threshold)
    for i, text in enumerate(texts):
        for j in index.matches(text):
            a, b = root(i), root(j)
            parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(len(texts))]


def cluster_key(texts: Iterable[str]) -> str:
    """A key that depends only on the cluster's contents (not on file order): the smallest member hash."""
    return min(hashlib.sha256(" ".join(words(t)).encode("utf-8")).hexdigest() for t in texts)


def with_near_duplicate(corpus: Sequence[str], held: Sequence[str], threshold: float = THRESHOLD) -> list[int]:
    """Indices of `corpus` texts that have a near-duplicate among `held`."""
    index = NearDuplicateIndex(held, threshold)
    return [i for i, text in enumerate(corpus) if index.matches(text)]


def count_by_all_pairs(corpus: Sequence[str], judged: Sequence[str], threshold: float = THRESHOLD) -> int:
    """How many `corpus` texts near-duplicate a `judged` text, by comparing every pair (no index): the
    check after cleaning that does not rely on the join that cleaned. A size filter skips only pairs whose
    set sizes alone rule out Jaccard >= threshold (|x & y| <= min(|x|, |y|))."""
    judged_views = [views(t) for t in judged]
    found = 0
    for text in corpus:
        mine = views(text)
        for theirs in judged_views:
            if any(min(len(a), len(b)) >= threshold * max(len(a), len(b)) and jaccard(a, b) >= threshold
                   for a, b in zip(mine, theirs, strict=True)):
                found += 1
                break
    return found

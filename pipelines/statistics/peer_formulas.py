"""The peers' corpus statistics, as plain functions both drivers call: PMI-Masking's collocations
(Levine et al., ICLR 2021) and InforMask's informative relevance (Sadeq et al., EMNLP 2022).

Words are `maskstream.mask_signal.words`' words. A *phrase* is a run of words with nothing but white
space between them and no line break: punctuation, a symbol or a line break ends it, as a token
between two words ends a match in the loader (maskstream.mask_signal.peer_lookup). A *sentence* is
the words between two sentence ends (`.`, `!` or `?` before white space or the end of the text, or a
line break). No n-gram crosses a phrase's end, no co-occurring pair a sentence's.

Collocations (formula `pmi-ngram-v2`):
    count every word n-gram, n = 1..MAX_N, of every phrase; p(g) = count(g) / (n-grams of g's length);
    pmi_n(g) = min over the ways to cut g into 2 or more contiguous parts s_1..s_k of
               log p(g) - sum_i log p(s_i)          (the paper's measure; n = 2: plain PMI)
    the vocabulary: n = 2..MAX_N, count >= ngram_min_count, pmi_n > 0, the `max_collocations` best
    by (pmi_n, n-gram text). A count is never smaller than the count of a longer n-gram holding it,
    so every part of a candidate is counted too.

Informative relevance (formula `informative-relevance-v1`):
    each sentence's distinct words (the first SENTENCE_WORDS of them, so pairs stay <= 2016 a sentence);
    s(w): sentences holding w, S: sentences, c(a, b): sentences holding both, kept when >= pair_min_count;
    pmi(a, b) = log(c(a, b) * S / (s(a) * s(b)));
    relevance(w) = sum_b c(w, b) * pmi(w, b) / s(w): the mean over w's sentences of the sum of w's
                   PMI with the other words of the sentence (InforMask's informative relevance), the
                   sum exactly rounded (`math.fsum`), so it does not depend on the order of the terms;
    mask_weight(w) = the average rank of relevance(w) among the word types, / word types: in (0, 1].
    InforMask turns relevance into per-token masking rates; ours is that rank, scaled to the budget
    per sequence like the difference signal (docs/peer-signals.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from maskstream.mask_signal.words import normalize_word, word_boundaries

MAX_N = 5
SENTENCE_WORDS = 64
SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)|\n")

Ngram = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PeerSignalSettings:
    """`maskstream build --peer-signals`' options, stored in the manifest's `peer_signals`.

    ngram_min_count: least count of a collocation. max_collocations: the vocabulary's size at most.
    pair_min_count: least number of sentences two words share for their PMI to count."""

    ngram_min_count: int = 5
    max_collocations: int = 100_000
    pair_min_count: int = 3

    def __post_init__(self) -> None:
        for name in ("ngram_min_count", "max_collocations", "pair_min_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


# ---------------------------------------------------------------- phrases, sentences and n-grams


def split(text: str) -> tuple[list[list[str]], list[list[str]]]:
    """(phrases, sentences) of `text`: its normalized words cut at phrase ends and at sentence ends
    (module doc; parts without a word dropped), from one pass over its words."""
    starts, ends = word_boundaries(text)
    if not len(starts):
        return [], []
    words = [normalize_word(text[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
    gaps = [text[e:s] for e, s in zip(ends[:-1].tolist(), starts[1:].tolist(), strict=True)]
    phrase_breaks = [i + 1 for i, gap in enumerate(gaps) if not gap.isspace() or "\n" in gap]
    cuts = np.fromiter((match.end() for match in SENTENCE_END.finditer(text)), np.int64)
    sentence_breaks = (np.flatnonzero(np.diff(np.searchsorted(cuts, starts, side="right"))) + 1).tolist()

    def cut_at(breaks: list[int]) -> list[list[str]]:
        return [words[a:b] for a, b in itertools.pairwise([0, *breaks, len(words)])]

    return cut_at(phrase_breaks), cut_at(sentence_breaks)


def ngrams(phrase: Sequence[str], max_n: int = MAX_N) -> Iterator[Ngram]:
    """Every n-gram of `phrase`, n = 1..max_n, in order of length then position."""
    for n in range(1, max_n + 1):
        for start in range(len(phrase) - n + 1):
            yield tuple(phrase[start : start + n])


class PeerCounts:
    """The counts both signals are computed from, all sums over texts (so over batches or files):
    n-grams, the sentences holding each word, the sentences holding each word pair, sentences."""

    def __init__(self) -> None:
        self.ngrams: Counter[Ngram] = Counter()
        self.sentences: Counter[str] = Counter()
        self.pairs: Counter[tuple[str, str]] = Counter()
        self.total = 0

    def count(self, texts: Iterable[str]) -> PeerCounts:
        """Adds the n-grams, words and word pairs of `texts` (one split of each text for both)."""
        for text in texts:
            text_phrases, text_sentences = split(text)
            for phrase in text_phrases:
                self.ngrams.update(ngrams(phrase))
            for sentence in text_sentences:
                word_set = sentence_word_set(sentence)
                self.total += 1
                self.sentences.update(word_set)
                self.pairs.update(word_pairs(word_set))
        return self

    def add(self, other: PeerCounts) -> None:
        self.ngrams.update(other.ngrams)
        self.sentences.update(other.sentences)
        self.pairs.update(other.pairs)
        self.total += other.total


def ngram_counts(texts: Iterable[str]) -> Counter[Ngram]:
    """count(g) of every n-gram of `texts`' phrases, n = 1..MAX_N."""
    return PeerCounts().count(texts).ngrams


def ngram_totals(counts: Iterable[tuple[Ngram, int]]) -> dict[int, int]:
    """n -> the number of n-grams of length n (positions, not types)."""
    totals: dict[int, int] = {}
    for ngram, count in counts:
        totals[len(ngram)] = totals.get(len(ngram), 0) + count
    return totals


def cuts(n: int) -> list[tuple[tuple[int, int], ...]]:
    """Every way to cut range(n) into 2 or more contiguous parts, as (start, end) pairs: 2^(n-1) - 1."""
    ways = []
    for mask in range(1, 1 << (n - 1)):
        points = [0, *(i + 1 for i in range(n - 1) if mask >> i & 1), n]
        ways.append(tuple(itertools.pairwise(points)))
    return ways


def parts(ngram: Ngram) -> list[Ngram]:
    """The distinct proper contiguous parts of `ngram` (the counts its score needs), and itself."""
    n = len(ngram)
    return sorted({ngram[a:b] for a in range(n) for b in range(a + 1, n + 1)})


def pmi_n(ngram: Ngram, counts: Mapping[Ngram, int], totals: Mapping[int, int]) -> float:
    """Levine et al.'s PMI of an n-gram (n >= 2): the least, over its cuts, of log p(g) - sum log p(part)."""

    def log_p(g: Ngram) -> float:
        return math.log(counts[g]) - math.log(totals[len(g)])

    whole = log_p(ngram)
    return min(whole - math.fsum(log_p(ngram[a:b]) for a, b in way) for way in cuts(len(ngram)))


def is_candidate(ngram: Ngram, count: int, settings: PeerSignalSettings) -> bool:
    return len(ngram) >= 2 and count >= settings.ngram_min_count


def collocation_order(row: tuple[Ngram, int, float]) -> tuple[float, str]:
    """The vocabulary's order, best first when reversed: (pmi_n, the n-gram's text); a total order."""
    return row[2], " ".join(row[0])


def collocation_vocabulary(counts: Mapping[Ngram, int], settings: PeerSignalSettings,
                           known: Callable[[Ngram], bool] = lambda ngram: True) -> list[tuple[Ngram, int, float]]:
    """(n-gram, count, pmi_n) of the vocabulary, best first: the in-process form of the Beam transforms.
    `known`: whether the word table holds every word of an n-gram (one that does not cannot be matched
    in a shard, so it does not take a place in the vocabulary)."""
    totals = ngram_totals(counts.items())
    scored = [(g, c, pmi_n(g, counts, totals)) for g, c in counts.items() if is_candidate(g, c, settings)]
    kept = [row for row in scored if row[2] > 0 and known(row[0])]
    return sorted(kept, key=collocation_order, reverse=True)[: settings.max_collocations]


# ---------------------------------------------------------------- informative relevance


def sentence_word_set(sentence: Sequence[str]) -> tuple[str, ...]:
    """A sentence's distinct words (its first SENTENCE_WORDS distinct ones), sorted."""
    return tuple(sorted(list(dict.fromkeys(sentence))[:SENTENCE_WORDS]))


def word_pairs(word_set: Sequence[str]) -> Iterator[tuple[str, str]]:
    """The pairs (a, b), a < b, of a sorted distinct word set."""
    return itertools.combinations(word_set, 2)


def pair_pmi(count: int, sentences_a: int, sentences_b: int, total_sentences: int) -> float:
    """pmi(a, b) = log(c(a, b) * S / (s(a) * s(b)))."""
    return math.log(count) + math.log(total_sentences) - math.log(sentences_a) - math.log(sentences_b)


def relevance(terms: Iterable[float], sentences_with_word: int) -> float:
    """The mean informative relevance of a word: its terms c * pmi summed exactly, / s(w)."""
    return math.fsum(terms) / sentences_with_word


def mask_weights(relevances: np.ndarray) -> np.ndarray:
    """Average rank of each relevance (1 = least relevant; ties share their mean rank) / the count."""
    relevances = np.asarray(relevances, np.float64)
    if not len(relevances):
        return np.zeros(0, np.float32)
    _, inverse, tally = np.unique(relevances, return_inverse=True, return_counts=True)
    upper = np.cumsum(tally)
    mean_rank = upper - (tally - 1) / 2.0
    return (mean_rank[inverse] / len(relevances)).astype(np.float32)


def informative_relevance(texts: Iterable[str], settings: PeerSignalSettings) -> tuple[dict[str, int], dict[str, float], int]:
    """(s(w), relevance(w), S) over `texts`: the in-process form of the Beam transforms."""
    counts = PeerCounts().count(texts)
    return dict(counts.sentences), relevance_of_counts(counts.sentences, counts.pairs, counts.total, settings), counts.total


def relevance_of_counts(sentence_counts: Mapping[str, int], pair_counts: Mapping[tuple[str, str], int], total: int,
                        settings: PeerSignalSettings) -> dict[str, float]:
    """relevance(w) for every word of `sentence_counts` from the counts."""
    terms: dict[str, list[float]] = {word: [] for word in sentence_counts}
    for (a, b), count in pair_counts.items():
        if count >= settings.pair_min_count:
            term = count * pair_pmi(count, sentence_counts[a], sentence_counts[b], total)
            terms[a].append(term)
            terms[b].append(term)
    return {word: relevance(word_terms, sentence_counts[word]) for word, word_terms in terms.items()}

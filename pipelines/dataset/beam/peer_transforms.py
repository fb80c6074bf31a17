"""`maskstream build --peer-signals`: the peers' signals as Beam transforms (the formulas and their
in-process form: pipelines/statistics/peer_formulas.py).

    CountPeers             documents -> n-gram counts (n = 1..5, inside phrases), sentences per word
                           and per word pair, sentences: counted per batch of documents, summed by key
    ScoreCollocations      n-gram counts -> the collocation vocabulary: candidates joined with their
                           parts' counts (CoGroupByKey), scored, the best `max_collocations` (Top)
    InformativeRelevance   word and pair counts -> (word, sentences, relevance): each pair joined with
                           both words' counts -> terms -> summed per word
    WritePeerSignals       both -> collocations.parquet, informativeness.parquet; the manifest's entry

Nothing per word or per n-gram is in the job's graph: every table is a PCollection, so the job's size
does not grow with the vocabulary. Keyed combines hold one (key, count) per n-gram type a worker
sees (docs/peer-signals.md gives the measured bytes); the vocabulary and the per-word relevances are
gathered once, to be written as one table each, as the word scores are.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam

from maskstream.pipelines.corpus import Document
from maskstream.pipelines.dataset.core.peer_tables import words_known
from maskstream.pipelines.dataset.steps import write_peer_signals
from maskstream.pipelines.statistics.peer_formulas import (
    PeerCounts,
    PeerSignalSettings,
    collocation_order,
    is_candidate,
    ngram_totals,
    pair_pmi,
    parts,
    pmi_n,
    relevance,
)
from maskstream.pipelines.statistics.stats_transforms import batch_documents

LENGTHS, PAIRS, WORDS, SENTENCES = "lengths", "pairs", "words", "sentences"


class CountPeersFn(beam.DoFn):
    """A batch of documents -> (n-gram, count) for each distinct n-gram of the batch; on LENGTHS
    (n, n-grams of length n), on PAIRS (word pair, sentences holding both), on WORDS (word, sentences
    holding it), on SENTENCES the batch's number of sentences (PeerCounts: one split of each text)."""

    def __init__(self) -> None:
        self._ms = beam.metrics.Metrics.counter("build", "peer_counts_ms")

    def process(self, batch: Sequence[Document]) -> Iterator[Any]:
        started = time.perf_counter()
        counts = PeerCounts().count(document.text for document in batch)
        self._ms.inc(int((time.perf_counter() - started) * 1000))
        yield from counts.ngrams.items()
        for n, total in ngram_totals(counts.ngrams.items()).items():
            yield beam.pvalue.TaggedOutput(LENGTHS, (n, total))
        for pair, holding in counts.pairs.items():
            yield beam.pvalue.TaggedOutput(PAIRS, (pair, holding))
        for word, holding in counts.sentences.items():
            yield beam.pvalue.TaggedOutput(WORDS, (word, holding))
        yield beam.pvalue.TaggedOutput(SENTENCES, counts.total)


class CountPeers(beam.PTransform):
    """PCollection[Document] -> the corpus's PeerCounts as PCollections: {"ngrams": (n-gram, count),
    "totals": (n, n-grams of length n), "pairs": (pair, sentences), "words": (word, sentences),
    "sentences": singleton S}. Counted per batch of documents, then summed by key."""

    def expand(self, documents):
        per_batch = (
            documents
            | "BatchDocuments" >> batch_documents()
            | "CountPerBatch" >> beam.ParDo(CountPeersFn()).with_outputs(LENGTHS, PAIRS, WORDS, SENTENCES,
                                                                         main="ngrams"))
        return {"ngrams": per_batch.ngrams | "SumPerNgram" >> beam.CombinePerKey(sum),
                "totals": per_batch[LENGTHS] | "SumPerLength" >> beam.CombinePerKey(sum),
                "pairs": per_batch[PAIRS] | "SumPerPair" >> beam.CombinePerKey(sum),
                "words": per_batch[WORDS] | "SumPerWord" >> beam.CombinePerKey(sum),
                "sentences": per_batch[SENTENCES] | "SumSentences" >> beam.CombineGlobally(sum)}


def _parts_wanted(element: tuple[tuple[str, ...], int]) -> Iterator[tuple[tuple[str, ...], tuple[str, ...]]]:
    ngram, _ = element
    for part in parts(ngram):
        yield part, ngram


def _counts_to_wanting(element: tuple[tuple[str, ...], dict[str, list]]) -> Iterator[tuple[tuple[str, ...], Any]]:
    part, joined = element
    for count in joined["count"]:
        for ngram in joined["wanted_by"]:
            yield ngram, (part, count)


def _score(element: tuple[tuple[str, ...], Any], totals: dict[int, int]) -> tuple[tuple[str, ...], int, float]:
    ngram, part_counts = element
    counts = dict(part_counts)
    return ngram, counts[ngram], pmi_n(ngram, counts, totals)


class ScoreCollocations(beam.PTransform):
    """CountPeers' {"ngrams", "totals"} -> a singleton list of (n-gram, count, pmi_n), best first, of
    n-grams whose words the word table (`lookup`, a singleton WordLookup) holds."""

    def __init__(self, settings: PeerSignalSettings, lookup):
        super().__init__()
        self._settings, self._lookup = settings, lookup

    def expand(self, counted):
        settings, totals = self._settings, counted["totals"]
        # A part is at least as frequent as the n-gram holding it: only these counts can be wanted.
        frequent = counted["ngrams"] | "FrequentNgrams" >> beam.Filter(lambda kv: kv[1] >= settings.ngram_min_count)
        wanted = (frequent
                  | "Candidates" >> beam.Filter(lambda kv: is_candidate(kv[0], kv[1], settings))
                  | "PartsWanted" >> beam.FlatMap(_parts_wanted))
        return (
            {"count": frequent, "wanted_by": wanted}
            | "JoinPartCounts" >> beam.CoGroupByKey()
            | "PartCountToNgram" >> beam.FlatMap(_counts_to_wanting)
            | "GroupParts" >> beam.GroupByKey()
            | "ScoreNgram" >> beam.Map(_score, beam.pvalue.AsDict(totals))
            | "PositivePmi" >> beam.Filter(lambda row, lookup: row[2] > 0 and words_known(lookup)(row[0]),
                                           beam.pvalue.AsSingleton(self._lookup))
            | "BestCollocations" >> beam.combiners.Top.Of(settings.max_collocations, key=collocation_order)
        )


def _first_word_joined(element: tuple[str, dict[str, list]]) -> Iterator[tuple[str, tuple[str, int, int]]]:
    a, joined = element
    for sentences_a in joined["sentences"]:
        for b, count in joined["pairs"]:
            yield b, (a, count, sentences_a)


def _terms(element: tuple[str, dict[str, list]], total_sentences: int) -> Iterator[tuple[str, float]]:
    b, joined = element
    for sentences_b in joined["sentences"]:
        for a, count, sentences_a in joined["pairs"]:
            term = count * pair_pmi(count, sentences_a, sentences_b, total_sentences)
            yield a, term
            yield b, term


def _relevance(element: tuple[str, dict[str, list]]) -> tuple[str, int, float]:
    word, joined = element
    (sentences_with_word,) = joined["sentences"]
    return word, sentences_with_word, relevance(joined["terms"], sentences_with_word)


class InformativeRelevance(beam.PTransform):
    """CountPeers' {"pairs", "words", "sentences"} -> PCollection[(word, sentences, relevance)]."""

    def __init__(self, settings: PeerSignalSettings):
        super().__init__()
        self._settings = settings

    def expand(self, counted):
        min_count = self._settings.pair_min_count
        sentence_counts = counted["words"]
        by_first = (counted["pairs"]
                    | "FrequentPairs" >> beam.Filter(lambda kv: kv[1] >= min_count)
                    | "KeyByFirstWord" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1]))))
        by_second = ({"sentences": sentence_counts, "pairs": by_first}
                     | "JoinFirstWord" >> beam.CoGroupByKey()
                     | "KeyBySecondWord" >> beam.FlatMap(_first_word_joined))
        terms = ({"sentences": sentence_counts, "pairs": by_second}
                 | "JoinSecondWord" >> beam.CoGroupByKey()
                 | "PairTerms" >> beam.FlatMap(_terms, beam.pvalue.AsSingleton(counted["sentences"])))
        return ({"sentences": sentence_counts, "terms": terms}
                | "JoinTerms" >> beam.CoGroupByKey()
                | "Relevance" >> beam.Map(_relevance))


class WritePeerSignals(beam.PTransform):
    """PCollection[Document] -> a singleton: the manifest's `peer_signals` entry, once both tables are written."""

    def __init__(self, version_url: str, settings: PeerSignalSettings, lookup):
        super().__init__()
        self._version_url, self._settings, self._lookup = version_url, settings, lookup

    def expand(self, documents):
        counted = documents | "CountPeers" >> CountPeers()
        vocabulary = counted | "ScoreCollocations" >> ScoreCollocations(self._settings, self._lookup)
        relevances = counted | "InformativeRelevance" >> InformativeRelevance(self._settings)
        return (
            documents.pipeline
            | "Once" >> beam.Create([None])
            | "WriteTables" >> beam.Map(
                _write, self._version_url, self._settings, beam.pvalue.AsSingleton(vocabulary),
                beam.pvalue.AsList(relevances), beam.pvalue.AsSingleton(counted["sentences"]),
                beam.pvalue.AsSingleton(self._lookup))
        )


def _write(_, version_url: str, settings: PeerSignalSettings, vocabulary: list, relevances: list,
           total_sentences: int, lookup) -> dict[str, Any]:
    return write_peer_signals(version_url, vocabulary, relevances, total_sentences, lookup, settings)

"""The peers' counts per input file, for `maskstream update --peer-signals` and `watch`: each file's
n-gram counts, the sentences holding each word, its word-pair sentence counts and its number of
sentences, all sums over the file's sentences, so the corpus's are the sums over its files. An
update counts only the files whose entry lacks them, merges every file's, and scores the merged
counts with the formulas' in-process form (pipelines/statistics/collocations.py): the same tables,
byte for byte, as `maskstream build --peer-signals` of the same corpus.

    ROOT/_cache/files/KEY/peer/{ngrams.parquet, words.parquet, pairs.parquet, entry.json}

inside the file's own entry (`maskstream gc` removes them with it); entry.json is written last.

Limit: the merge holds every n-gram type and word pair of the corpus in this process, about
PEER_BYTES_PER_TYPE bytes each (docs/peer-signals.md): the in-process paths are for corpora whose
n-gram types fit in memory; larger ones are rebuilt with `maskstream build --peer-signals`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.pipelines.build.core.peer_signals import collocation_table, informativeness_table
from maskstream.pipelines.build.steps import write_peer_signals
from maskstream.pipelines.corpus import Document
from maskstream.pipelines.statistics.collocations import (
    PeerCounts,
    PeerSignalSettings,
    collocation_vocabulary,
    relevance_of_counts,
)
from maskstream.pipelines.update.cache import (
    ENTRY_NAME,
    FILES_DIR,
    IO_THREADS,
    parse_file,
    write_parquet_file,
)
from maskstream.storage.publish import write_atomically

PEER_DIR = "peer"
PEER_BYTES_PER_TYPE = 133  # an n-gram type of the shipped corpus (a word pair: 96), benchmarks/peer_signals.py


def peer_entry_url(cache_url: str, key: str) -> str:
    return f"{cache_url.rstrip('/')}/{FILES_DIR}/{key}/{PEER_DIR}"


def write_peer_entry(url: str, counts: PeerCounts) -> None:
    ngram_keys = sorted(counts.ngrams)
    write_parquet_file(pa.table({"ngram": pa.array([list(g) for g in ngram_keys], pa.list_(pa.string())),
                                 "count": pa.array([counts.ngrams[g] for g in ngram_keys], pa.int64())}),
                       f"{url}/ngrams.parquet")
    words = sorted(counts.sentences)
    write_parquet_file(pa.table({"word": pa.array(words, pa.string()),
                                 "sentences": pa.array([counts.sentences[w] for w in words], pa.int64())}),
                       f"{url}/words.parquet")
    pairs = sorted(counts.pairs)
    write_parquet_file(pa.table({"a": pa.array([a for a, _ in pairs], pa.string()),
                                 "b": pa.array([b for _, b in pairs], pa.string()),
                                 "count": pa.array([counts.pairs[p] for p in pairs], pa.int64())}),
                       f"{url}/pairs.parquet")
    write_atomically(f"{url}/{ENTRY_NAME}", json.dumps({"sentences": counts.total}).encode("utf-8"))


def read_peer_entry(url: str) -> PeerCounts:
    counts = PeerCounts()
    with fsspec.open(f"{url}/{ENTRY_NAME}", "rb") as f:
        counts.total = json.loads(f.read())["sentences"]

    def table(name: str) -> pa.Table:
        with fsspec.open(f"{url}/{name}.parquet", "rb") as f:
            return pq.read_table(f)

    ngram_table, words, pairs = table("ngrams"), table("words"), table("pairs")
    counts.ngrams.update(dict(zip(map(tuple, ngram_table.column("ngram").to_pylist()),
                                  ngram_table.column("count").to_pylist(), strict=True)))
    counts.sentences.update(dict(zip(words.column("word").to_pylist(), words.column("sentences").to_pylist(),
                                     strict=True)))
    counts.pairs.update(dict(zip(zip(pairs.column("a").to_pylist(), pairs.column("b").to_pylist(), strict=True),
                                 pairs.column("count").to_pylist(), strict=True)))
    return counts


def has_peer_entry(cache_url: str, key: str) -> bool:
    fs, path = fsspec.core.url_to_fs(f"{peer_entry_url(cache_url, key)}/{ENTRY_NAME}")
    return fs.exists(path)


def count_peer_files(cache_url: str, keys: dict[str, str], text_field: str, txt_mode: str) -> int:
    """Writes the peer counts of every file of `keys` (path -> cache key) whose entry lacks them,
    reading the file again; returns how many it counted."""
    missing = sorted((path, key) for path, key in keys.items() if not has_peer_entry(cache_url, key))
    for path, key in missing:
        documents, _ = parse_file(path, text_field, txt_mode)
        texts = [d.text for d in documents if isinstance(d, Document)]
        write_peer_entry(peer_entry_url(cache_url, key), PeerCounts().count_ngrams(texts).count_sentences(texts))
    return len(missing)


def merged_peer_counts(cache_url: str, keys: Sequence[str]) -> PeerCounts:
    """The sum of the files' peer counts."""
    merged = PeerCounts()
    with ThreadPoolExecutor(IO_THREADS) as pool:
        for counts in pool.map(lambda key: read_peer_entry(peer_entry_url(cache_url, key)), keys):
            merged.add(counts)
    return merged


def write_merged_peer_signals(cache_url: str, keys: Sequence[str], lookup: WordLookup, version_url: str,
                              settings: PeerSignalSettings) -> dict[str, Any]:
    """Scores the files' summed counts and writes the version's two tables (steps.write_peer_signals);
    returns the manifest's `peer_signals` entry."""
    counts = merged_peer_counts(cache_url, keys)
    vocabulary = collocation_vocabulary(counts.ngrams, settings)
    relevance = relevance_of_counts(counts.sentences, counts.pairs, counts.total, settings)
    words = list(relevance)
    informativeness = informativeness_table(words, [counts.sentences[w] for w in words],
                                            [relevance[w] for w in words], lookup)
    return write_peer_signals(version_url, collocation_table(vocabulary, lookup), informativeness, settings,
                              counts.total)

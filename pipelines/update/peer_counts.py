"""The peers' counts per input file, for `maskstream update --peer-signals` and `watch`: each file's
n-gram counts, the sentences holding each word, its word-pair sentence counts and its number of
sentences, all sums over the file's sentences, so the corpus's are the sums over its files. An
update counts only the files whose entry lacks them, merges every file's, and scores the merged
counts with the formulas' in-process form (pipelines/statistics/peer_formulas.py): the same tables,
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
from maskstream.pipelines.corpus import Document
from maskstream.pipelines.dataset.core.peer_tables import words_known
from maskstream.pipelines.dataset.steps import write_peer_signals
from maskstream.pipelines.statistics.peer_formulas import (
    MAX_N,
    SENTENCE_WORDS,
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
from maskstream.pipelines.update.memory import available_memory
from maskstream.schemas.formulas import PEER_FORMULA_VERSIONS
from maskstream.storage.publish import write_atomically

PEER_DIR = "peer"
# What decides a file's counts besides its content and the file entry's key (the word rule, the
# tokenizer): counts made another way are counted again, not summed with these.
COUNTED_AS = {"format": 1, "formulas": dict(PEER_FORMULA_VERSIONS), "max_n": MAX_N, "sentence_words": SENTENCE_WORDS}
PEER_BYTES_PER_TYPE = 129  # an n-gram type of the shipped corpus (a word pair: 96), benchmarks/peer_signals.py


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
    write_atomically(f"{url}/{ENTRY_NAME}", json.dumps({"sentences": counts.total, **COUNTED_AS}).encode("utf-8"))


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
    """Whether the file's entry holds peer counts counted as this maskstream counts them (COUNTED_AS)."""
    fs, path = fsspec.core.url_to_fs(f"{peer_entry_url(cache_url, key)}/{ENTRY_NAME}")
    if not fs.exists(path):
        return False
    entry = json.loads(fs.cat_file(path))
    return all(entry.get(name) == value for name, value in COUNTED_AS.items())


def count_peer_files(cache_url: str, keys: dict[str, str], text_field: str, txt_mode: str) -> int:
    """Writes the peer counts of every file of `keys` (path -> cache key) whose entry lacks them,
    reading the file again; returns how many it counted."""
    missing = sorted((path, key) for path, key in keys.items() if not has_peer_entry(cache_url, key))
    for path, key in missing:
        documents, _ = parse_file(path, text_field, txt_mode)
        write_peer_entry(peer_entry_url(cache_url, key),
                         PeerCounts().count(d.text for d in documents if isinstance(d, Document)))
    return len(missing)


def check_peer_memory(cache_url: str, keys: Sequence[str]) -> None:
    """Raises MemoryError when the files' n-gram types and word pairs (bounded by the sum of each file's
    own) need more memory than is available, PEER_BYTES_PER_TYPE each, before they are merged."""

    def keys_of(key: str) -> int:
        url = peer_entry_url(cache_url, key)
        total = 0
        for name in ("ngrams", "pairs"):
            with fsspec.open(f"{url}/{name}.parquet", "rb") as f:
                total += pq.ParquetFile(f).metadata.num_rows
        return total

    with ThreadPoolExecutor(IO_THREADS) as pool:
        bound = sum(pool.map(keys_of, keys))
    needed, available = bound * PEER_BYTES_PER_TYPE, available_memory()
    if available is not None and needed > available:
        raise MemoryError(
            f"`maskstream update --peer-signals` sums up to {bound:,} n-gram types and word pairs in one process, "
            f"about {needed / 2**30:.1f} GiB; {available / 2**30:.1f} GiB are available. Build this corpus with "
            "`maskstream build --peer-signals` on Dataflow (--runner=DataflowRunner)")


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
    check_peer_memory(cache_url, keys)
    counts = merged_peer_counts(cache_url, keys)
    vocabulary = collocation_vocabulary(counts.ngrams, settings, known=words_known(lookup))
    relevance = relevance_of_counts(counts.sentences, counts.pairs, counts.total, settings)
    relevances = [(word, counts.sentences[word], value) for word, value in relevance.items()]
    return write_peer_signals(version_url, vocabulary, relevances, counts.total, lookup, settings)

"""What `maskstream inspect` shows of a version's peer signals (`--peer-signals`): the top
collocations, which of them the sequences hold (matched as the loader matches them,
maskstream.mask_signal.peer_lookup) and the share of words inside one, and the most and least
informative words."""

from __future__ import annotations

import dataclasses
import posixpath
from collections import Counter
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from maskstream.mask_signal.peer_lookup import PeerSignals
from maskstream.schemas.manifest import Manifest, safe_relative_path

SHOWN = 12  # collocations and words per list
MIN_SENTENCES = 5  # a word's informativeness is listed when this many sentences hold it
SCANNED_ROWS = 5000  # rows matched for "found" (the first shards'): enough to rank what is common


@dataclasses.dataclass
class PeerSignalSummary:
    collocations: int
    by_length: dict[int, int]  # n -> collocations of n words
    top: list[tuple[str, int, float]]  # (n-gram, count, pmi) best first
    found: list[tuple[str, int]]  # (n-gram, occurrences in the scanned rows), most found first
    rows_scanned: int
    words_in_collocations: float  # share of the scanned rows' word occurrences inside a collocation
    most_informative: list[tuple[str, float, int]]  # (word, relevance, sentences)
    least_informative: list[tuple[str, float, int]]


def read_table(version_url: str, name: str, columns: list[str] | None = None) -> pa.Table:
    """A table of the version (local or gs://), by its path in the manifest."""
    with fsspec.open(posixpath.join(version_url, safe_relative_path(name)), "rb") as f:
        return pq.read_table(f, columns=columns)


def summarize(version_url: str, manifest: Manifest, word_table: pa.Table) -> PeerSignalSummary | None:
    """The summary of the version's peer signals; None for a version built without them."""
    entry = manifest.peer_signals
    if not entry:
        return None
    collocations = read_table(version_url, entry["collocations"])
    words = np.empty(word_table.num_rows, object)
    words[word_table.column("word_index").to_numpy()] = word_table.column("word").to_pylist()
    lengths = Counter(collocations.column("n").to_pylist())
    top = list(zip(*(collocations.column(name).slice(0, SHOWN).to_pylist() for name in ("ngram", "count", "pmi")),
                   strict=True))
    found, rows, in_collocations, occurrences = scan(version_url, manifest, PeerSignals.load(version_url, manifest),
                                                     words)
    table = read_table(version_url, entry["informativeness"])
    frequent = table.filter(pc.greater_equal(table.column("sentences"), MIN_SENTENCES))
    order = np.argsort(-frequent.column("relevance").to_numpy(), kind="stable")
    listed = [(str(words[i]), float(r), int(s)) for i, r, s in zip(
        frequent.column("word_index").to_numpy()[order], frequent.column("relevance").to_numpy()[order],
        frequent.column("sentences").to_numpy()[order], strict=True)]
    return PeerSignalSummary(collocations.num_rows, dict(sorted(lengths.items())), top, found.most_common(SHOWN),
                             rows, in_collocations / max(occurrences, 1), listed[:SHOWN], listed[::-1][:SHOWN])


def scan(version_url: str, manifest: Manifest, signals: PeerSignals,
         words: np.ndarray) -> tuple[Counter[str], int, int, int]:
    """(collocations found, rows, word occurrences inside one, word occurrences) of the first SCANNED_ROWS rows."""
    found: Counter[str] = Counter()
    rows = inside = total = 0
    for shard in manifest.shards:
        table = read_table(version_url, shard.path, ["word_ids", "word_index"])
        for word_ids, word_index in zip(table.column("word_ids").to_pylist(), table.column("word_index").to_pylist(),
                                        strict=True):
            span_ids = signals.span_ids(np.array(word_ids), np.array(word_index))
            members: dict[int, list[tuple[int, int]]] = {}
            for occurrence, index, unit in zip(word_ids, word_index, span_ids.tolist(), strict=True):
                if index >= 0 and (occurrence, index) not in members.setdefault(unit, []):
                    members[unit].append((occurrence, index))
            for unit in members.values():
                total += len(unit)
                if len(unit) > 1:
                    inside += len(unit)
                    found[" ".join(str(words[index]) for _, index in unit)] += 1
            rows += 1
            if rows >= SCANNED_ROWS:
                return found, rows, inside, total
    return found, rows, inside, total


def peer_signal_lines(summary: PeerSignalSummary | None, manifest: Manifest) -> list[str]:
    """`maskstream inspect`'s text of the summary."""
    if summary is None:
        return ["peer signals     none (build with --peer-signals for pmi_span, difference_pmi_span, informask)"]
    settings = manifest.peer_signals["settings"]
    lengths = ", ".join(f"{count} of {n} words" for n, count in summary.by_length.items())
    return [
        f"peer signals     {summary.collocations} collocations ({lengths}; count >= {settings['ngram_min_count']}, "
        f"at most {settings['max_collocations']}), informativeness of {manifest.peer_signals['sentences']} sentences",
        "  top collocations (PMI, count): " + "; ".join(f"{g} ({p:.2f}, {c})" for g, c, p in summary.top),
        f"  found in the first {summary.rows_scanned} sequences: {summary.words_in_collocations:.1%} of the words are "
        "in a collocation; most found: " + "; ".join(f"{g} ({k})" for g, k in summary.found),
        f"  most informative words (relevance, sentences >= {MIN_SENTENCES}): "
        + ", ".join(f"{w} ({r:.1f})" for w, r, _ in summary.most_informative),
        "  least informative words (0: no pair of the word reaches --pair-min-count sentences; below 0: its pairs "
        "are rarer than chance): " + ", ".join(f"{w} ({r:.1f})" for w, r, _ in summary.least_informative),
    ]


def peer_signal_rows(summary: PeerSignalSummary) -> dict[str, list[list[Any]]]:
    """The HTML page's tables of the summary."""
    return {
        "collocations": [[g, f"{p:.2f}", str(c)] for g, c, p in summary.top],
        "found": [[g, str(k)] for g, k in summary.found],
        "informative": [[w, f"{r:.2f}", str(s)] for w, r, s in summary.most_informative],
        "uninformative": [[w, f"{r:.2f}", str(s)] for w, r, s in summary.least_informative],
    }

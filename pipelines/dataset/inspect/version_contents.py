"""What `maskstream inspect` reads of a version's shards, one shard at a time (the whole dataset is
never in memory at once): the non-special tokens' mask probabilities, each sequence's expected
masked fraction, the first few rows to show, and the signal tallies of every map."""

from __future__ import annotations

import dataclasses
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from maskstream.pipelines.dataset.core.signal_tallies import map_tallies
from maskstream.pipelines.dataset.storage.dataset_writer import join
from maskstream.schemas.manifest import Manifest, read_word_table
from maskstream.schemas.tables import SEQUENCE_SCHEMA, check_schema

COLUMNS = ["sequence_id", "input_ids", "word_ids", "word_index", "special_tokens_mask", "mask_probability"]


@dataclasses.dataclass
class VersionContents:
    word_table: pa.Table
    probabilities: np.ndarray  # every non-special token's mask probability
    rates: list[float]  # each sequence's expected masked fraction of its non-special tokens
    samples: list[dict[str, Any]]  # the first rows, every column
    tallies: list[dict]  # signal tallies (signal.map_tallies), one per shard


def read_version_contents(version_url: str, manifest: Manifest, samples: int) -> VersionContents:
    """Reads every shard of the version once. Raises SchemaMismatch for a shard of another schema."""
    word_table = read_word_table(version_url, manifest.word_table)
    similarity = np.zeros(word_table.num_rows, np.float32)
    similarity[word_table.column("word_index").to_numpy()] = word_table.column("similarity").to_numpy()
    probabilities: list[np.ndarray] = []
    rates: list[float] = []
    shown: list[dict[str, Any]] = []
    tallies = []
    for shard in manifest.shards:
        with fsspec.open(join(version_url, shard.path), "rb") as f:
            parquet = pq.ParquetFile(f)
            check_schema(parquet.schema_arrow, SEQUENCE_SCHEMA, shard.path)
            if len(shown) < samples:
                shown.extend(parquet.read_row_group(0).slice(0, samples - len(shown)).to_pylist())
            table = parquet.read(columns=COLUMNS)
        tallies.append(map_tallies(table, similarity, manifest.config, manifest.total_rows))
        special = np.asarray(table.column("special_tokens_mask").combine_chunks().flatten(), np.int8)
        probability = np.asarray(table.column("mask_probability").combine_chunks().flatten(), np.float32)
        probabilities.append(probability[special == 0])
        lengths = table.column("input_ids").combine_chunks().value_lengths().to_numpy()
        row = np.repeat(np.arange(len(lengths)), lengths)
        expected = np.bincount(row, weights=probability, minlength=len(lengths))
        count = np.bincount(row, weights=(special == 0), minlength=len(lengths))
        rates.extend((expected / np.maximum(count, 1)).tolist())
    return VersionContents(word_table, np.concatenate(probabilities) if probabilities else np.zeros(0, np.float32),
                           rates, shown, tallies)


def mark_tokens(tokens: list[str], probability: Any, special: Any, fraction: float) -> str:
    """Tokens joined by spaces, the top `fraction` of non-special tokens by probability as [[token]]."""
    probability = np.asarray(probability, np.float64)
    candidates = np.flatnonzero(np.asarray(special) == 0)
    k = max(1, round(fraction * len(candidates))) if len(candidates) else 0
    top = set(candidates[np.argsort(-probability[candidates], kind="stable")[:k]].tolist())
    return " ".join(f"[[{t}]]" if i in top else t for i, t in enumerate(tokens))

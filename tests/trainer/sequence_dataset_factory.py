"""Test fixture: a small but valid dataset version made from real text, without the Beam build.

Tokenizes Debian package descriptions with the offline MiniLM fast tokenizer, derives
`word_ids` from the tokenizer's offsets and `schemas.words.word_spans`, gives every token a
plausible non-uniform `mask_probability` (proportional to its length in characters, scaled to
sum to budget x non-special tokens, clipped to 1 with the excess redistributed), and writes
SEQUENCE_SCHEMA shards with `pq.ParquetWriter` plus a manifest with each shard's sha256 and a
`latest` pointer. Test data only: the real writer is `maskstream build`.
"""

from __future__ import annotations

import bisect
import datetime
import functools
import json
import os
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.formulas import FORMULA_VERSIONS
from schemas.manifest import (
    LATEST_POINTER,
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    sha256_file,
    shard_name,
    vocab_hash,
)
from schemas.models import default_model
from schemas.tables import SEQUENCE_SCHEMA
from schemas.words import word_spans

SAMPLE_CORPUS = Path(__file__).resolve().parents[2] / "data" / "debian-science.jsonl"


@functools.lru_cache(maxsize=1)
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model())


def read_texts(path: str | Path = SAMPLE_CORPUS, limit: int | None = None) -> list[str]:
    texts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if limit is not None and len(texts) >= limit:
                break
    return texts


def inclusion_probabilities(weights: np.ndarray, budget: float) -> np.ndarray:
    """Weights scaled to sum to budget x len, each clipped to 1 with the excess redistributed."""
    target = budget * len(weights)
    p = weights / weights.sum() * target
    for _ in range(20):
        over = p > 1
        if not over.any():
            break
        excess = (p[over] - 1).sum()
        p[over] = 1
        room = p < 1
        p[room] += excess * p[room] / p[room].sum()
    return p


def sequence_rows(texts: list[str], max_length: int = 128, budget: float = 0.15) -> list[dict[str, Any]]:
    """One SEQUENCE_SCHEMA row per text (truncated to `max_length` tokens), ids in order."""
    tok = tokenizer()
    encoded = tok(
        texts, truncation=True, max_length=max_length, return_offsets_mapping=True, return_special_tokens_mask=True
    )
    vocabulary: dict[str, int] = {}
    rows = []
    for n, text in enumerate(texts):
        ids = encoded["input_ids"][n]
        specials = encoded["special_tokens_mask"][n]
        offsets = encoded["offset_mapping"][n]
        spans = word_spans(text)
        starts = [s for s, _, _ in spans]
        word_ids, word_index = [], []
        occurrence, last_span = -1, None
        for (start, end), special in zip(offsets, specials, strict=True):
            if special:
                word_ids.append(-1)
                word_index.append(-1)
                continue
            k = bisect.bisect_right(starts, start) - 1
            inside = k >= 0 and spans[k][0] <= start and end <= spans[k][1]
            if not inside or k != last_span:
                occurrence += 1
            last_span = k if inside else None
            word_ids.append(occurrence)
            word_index.append(vocabulary.setdefault(spans[k][2], len(vocabulary)) if inside else -1)
        lengths = np.array([max(e - s, 1) for s, e in offsets], dtype=np.float64)
        is_special = np.array(specials, dtype=bool)
        probability = np.zeros(len(ids), dtype=np.float64)
        probability[~is_special] = inclusion_probabilities(lengths[~is_special], budget)
        rows.append(
            {
                "sequence_id": n,
                "document_id": f"{SAMPLE_CORPUS.name}:line {n + 1}",
                "input_ids": ids,
                "word_ids": word_ids,
                "word_index": word_index,
                "special_tokens_mask": specials,
                "mask_probability": probability.astype(np.float32),
            }
        )
    return rows


def tokenizer_entry() -> dict[str, Any]:
    tok = tokenizer()
    return {
        "name": default_model(),
        "vocab_hash": vocab_hash(tok.get_vocab()),
        "vocab_size": len(tok),
        "pad_token_id": tok.pad_token_id,
        "mask_token_id": tok.mask_token_id,
        "cls_token_id": tok.cls_token_id,
        "sep_token_id": tok.sep_token_id,
        "unk_token_id": tok.unk_token_id,
        "all_special_ids": sorted(tok.all_special_ids),
    }


def write_dataset(
    root: str, rows: list[dict[str, Any]], *, shards: int = 3, row_group_size: int = 40, version: str = "v1"
) -> str:
    """Writes `rows` as a complete version under `root` (local path or gs://) and points `latest`
    at it. Returns the version URL."""
    version_url = f"{root.rstrip('/')}/{version}"
    fs, base = fsspec.core.url_to_fs(version_url)
    fs.makedirs(base, exist_ok=True)
    entries = []
    bounds = np.linspace(0, len(rows), shards + 1).astype(int)
    for index in range(shards):
        part = rows[bounds[index] : bounds[index + 1]]
        name = shard_name(index, shards)
        table = pa.Table.from_pylist(part, schema=SEQUENCE_SCHEMA)
        with fs.open(f"{base}/{name}", "wb") as f, pq.ParquetWriter(f, SEQUENCE_SCHEMA) as writer:
            writer.write_table(table, row_group_size=row_group_size)
        url = f"{version_url}/{name}"
        entries.append(
            ShardEntry(
                path=name,
                rows=len(part),
                bytes=fs.size(f"{base}/{name}"),
                sha256=sha256_file(url),
                tokens=sum(len(r["input_ids"]) for r in part),
            )
        )
    manifest = Manifest(
        version=version,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        tokenizer=tokenizer_entry(),
        encoder={"name": default_model()},
        seeds=[],
        formulas=dict(FORMULA_VERSIONS),
        config={"budget": 0.15, "fixture": "tests/trainer/sequence_dataset_factory.py"},
        source_fingerprint={},
        shards=entries,
    )
    with fs.open(f"{base}/{MANIFEST_NAME}", "w") as f:
        f.write(manifest.to_json())
    root_fs, root_path = fsspec.core.url_to_fs(root.rstrip("/"))
    with root_fs.open(os.path.join(root_path, LATEST_POINTER) if "://" not in root else f"{root_path}/{LATEST_POINTER}", "w") as f:
        f.write(version)
    return version_url

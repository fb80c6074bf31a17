"""Fixtures for the trainer's data path: real Debian text, tokenized, written as dataset versions."""

from __future__ import annotations

from typing import Any

import pytest

from testing import sequence_dataset as factory


@pytest.fixture(scope="session")
def debian_rows() -> list[dict[str, Any]]:
    """400 real sequences (the first 400 descriptions of the shipped sample, up to 128 tokens), with the
    peer signals (`span_ids`, `informativeness`) of a `--peer-signals` build of them."""
    texts = factory.read_texts(limit=400)
    rows, vocabulary = factory.rows_and_vocabulary(texts)
    return factory.with_peer_signals(rows, factory.peer_signals_of(texts, vocabulary))


@pytest.fixture(scope="session")
def local_dataset(tmp_path_factory: pytest.TempPathFactory, debian_rows: list[dict[str, Any]]) -> str:
    """A dataset root: 400 rows in 3 shards of row groups of 40 rows, `latest` -> v1."""
    root = tmp_path_factory.mktemp("dataset")
    factory.write_dataset(str(root), debian_rows, shards=3, row_group_size=40)
    return str(root)


@pytest.fixture(scope="session")
def odd_dataset(tmp_path_factory: pytest.TempPathFactory, debian_rows: list[dict[str, Any]]) -> str:
    """101 rows in 2 shards (row groups of 16): a remainder for 2 ranks."""
    root = tmp_path_factory.mktemp("odd")
    factory.write_dataset(str(root), debian_rows[:101], shards=2, row_group_size=16)
    return str(root)

"""Fixtures for the fault suite: a small real dataset version (without the Beam build), copied
per test so that each test can damage its own."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from testing import sequence_dataset as factory


@pytest.fixture(scope="session")
def fault_rows() -> list[dict[str, Any]]:
    """120 real sequences (Debian descriptions, MiniLM tokenizer)."""
    return factory.sequence_rows(factory.read_texts(limit=120))


@pytest.fixture(scope="session")
def pristine_dataset(tmp_path_factory: pytest.TempPathFactory, fault_rows: list[dict[str, Any]]) -> Path:
    """120 rows in 2 shards, row groups of 20 rows, `latest` -> v1. Never modified."""
    root = tmp_path_factory.mktemp("pristine")
    factory.write_dataset(str(root), fault_rows, shards=2, row_group_size=20)
    return root


@pytest.fixture()
def dataset_copy(pristine_dataset: Path, tmp_path: Path) -> Path:
    """A copy of the pristine dataset root that the test may damage."""
    return Path(shutil.copytree(pristine_dataset, tmp_path / "dataset"))

"""One way to publish a file (issue 51): maskstream.storage.publish, local and through fsspec's
in-memory object store, and no other module of the product moving files into place itself."""

from __future__ import annotations

import re
from pathlib import Path

import fsspec
import pytest

from maskstream.storage.publish import move_into_place, open_atomically, write_atomically

REPO = Path(__file__).resolve().parents[1]
PRODUCT_FOLDERS = ("maskstream", "schemas", "pipelines", "trainer")
# a rename, os.replace, fsspec's mv or Beam's FileSystems.rename: moving a file into place
MOVES = re.compile(r"os\.replace\(|\.rename\(|\.mv\(|FileSystems\.rename")


class Interrupted(Exception):
    pass


def test_a_local_file_is_whole_or_untouched(tmp_path: Path) -> None:
    target = tmp_path / "new" / "folder" / "manifest.json"
    write_atomically(str(target), b"first")
    assert target.read_bytes() == b"first"
    with pytest.raises(Interrupted), open_atomically(str(target)) as f:
        f.write(b"half of the sec")
        raise Interrupted
    assert target.read_bytes() == b"first"
    assert sorted(p.name for p in target.parent.iterdir()) == ["manifest.json"]  # nothing left aside
    with open_atomically(str(target)) as f:
        f.write(b"second")
        assert target.read_bytes() == b"first"  # not visible before the block ends
    assert target.read_bytes() == b"second"


def test_written_aside_where_the_caller_says(tmp_path: Path) -> None:
    (tmp_path / "partial").mkdir()
    aside, target = tmp_path / "partial" / "shard.part", tmp_path / "shard.parquet"
    with pytest.raises(Interrupted), open_atomically(str(target), aside=str(aside)) as f:
        f.write(b"x" * 10)
        assert aside.exists() and f.tell() == 10
        raise Interrupted
    assert not aside.exists() and not target.exists()
    with open_atomically(str(target), aside=str(aside)) as f:
        f.write(b"whole")
    assert target.read_bytes() == b"whole" and not aside.exists()


def test_an_object_store_gets_one_upload_or_none() -> None:
    fs = fsspec.filesystem("memory")
    url = "memory://bucket/version/manifest.json"
    write_atomically(url, b"first")
    with pytest.raises(Interrupted), open_atomically(url) as f:
        f.write(b"half")
        raise Interrupted
    assert fs.cat_file("/bucket/version/manifest.json") == b"first"
    with open_atomically(url) as f:
        f.write(b"second")
    assert fs.cat_file("/bucket/version/manifest.json") == b"second"
    assert fs.ls("/bucket/version", detail=False) == ["/bucket/version/manifest.json"]


def test_move_into_place_moves_files_and_folders(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "a.parquet").write_bytes(b"a")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.parquet").write_bytes(b"old")
    move_into_place(str(staging / "a.parquet"), str(tmp_path / "out" / "a.parquet"))
    assert (tmp_path / "out" / "a.parquet").read_bytes() == b"a"

    folder = tmp_path / ".step-00000003.partial"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w")
    move_into_place(str(folder), str(tmp_path / "step-00000003"))
    assert (tmp_path / "step-00000003" / "model.safetensors").read_bytes() == b"w" and not folder.exists()


def test_no_other_module_moves_files_into_place() -> None:
    movers = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
              for folder in PRODUCT_FOLDERS for path in sorted((REPO / folder).rglob("*.py"))
              if path != REPO / "maskstream" / "storage" / "publish.py"
              for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if MOVES.search(line)]
    assert movers == []

"""A full disk or a refused write ends the command with one line that names the path, and a
non-zero exit status (74, EX_IOERR), not a traceback; the previous output is left as it was.

Tests run as root, whom file modes do not stop, so refusals are real where the OS gives them
(an output under a regular file) and injected where it does not (ENOSPC and EACCES raised by
Beam's local filesystem, as the kernel would on a full disk or a read-only mount).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from apache_beam.io.localfilesystem import LocalFileSystem

from maskstream.cli import EXIT_OS_ERROR, main
from tests.conftest import run_cli

CORPUS_LINES = ["sparse linear algebra solvers", "molecular dynamics with force fields", "fast fourier transforms"]


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS_LINES) + "\n")
    return path


@pytest.mark.slow
def test_output_under_a_regular_file_names_the_path(tmp_path: Path, corpus: Path, subprocess_env) -> None:
    (tmp_path / "afile").write_text("not a folder")
    result = run_cli(["stats", "--input", str(corpus), "--output", str(tmp_path / "afile" / "stats")],
                     subprocess_env, check=False)
    assert result.returncode == EXIT_OS_ERROR
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("maskstream stats: error: Not a directory: ")
    assert str(tmp_path / "afile" / "stats") in last


class FullDisk:
    """A writable file object whose writes fail as on a full disk (the error holds no file name)."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.mark.slow
def test_disk_full_names_the_output(tmp_path: Path, corpus: Path, monkeypatch, capsys) -> None:
    output = tmp_path / "stats"
    real_create = LocalFileSystem.create

    def create(self, path, *args, **kwargs):
        f = real_create(self, path, *args, **kwargs)
        return FullDisk(f) if str(tmp_path) in path else f

    monkeypatch.setattr(LocalFileSystem, "create", create)
    assert main(["stats", "--input", str(corpus), "--output", str(output)]) == EXIT_OS_ERROR
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"maskstream stats: error: No space left on device (writing under --output {output})"
    assert not output.exists()


@pytest.mark.slow
def test_permission_denied_names_the_file_and_keeps_the_previous_output(tmp_path: Path, corpus: Path, monkeypatch,
                                                                         capsys, subprocess_env) -> None:
    output = tmp_path / "stats"
    run_cli(["stats", "--input", str(corpus), "--output", str(output)], subprocess_env)
    before = {p.name: p.read_bytes() for p in output.iterdir()}

    def create(self, path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(LocalFileSystem, "create", create)
    assert main(["stats", "--input", str(corpus), "--output", str(output)]) == EXIT_OS_ERROR
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("maskstream stats: error: Permission denied: ")
    assert last.split(": ", 3)[-1].startswith(str(output))  # a file under (the staging folder beside) --output
    assert {p.name: p.read_bytes() for p in output.iterdir()} == before
    assert json.loads((output / "summary.json").read_text())["documents_accepted"] == 3

"""What `maskstream` prints when a command fails: one line (exit 74) for a real I/O failure, the
exception itself or one a runner such as Beam wrapped; a traceback (exit 1) for any other
exception, even one raised while some unrelated OSError was being handled."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import maskstream.cli.gc
import maskstream.pipelines.read_corpus
from maskstream.cli import EXIT_OS_ERROR, _os_error_in, main


def test_an_unrelated_exception_raised_while_handling_an_oserror_keeps_its_traceback(tmp_path: Path, monkeypatch):
    def collect_garbage(*args, **kwargs):
        try:
            open(tmp_path / "no-such-cache-file")  # noqa: SIM115 - a fallback path, as in HF or fsspec code
        except OSError:
            return {}["versions"]  # a bug in the fallback: not an I/O failure

    monkeypatch.setattr(maskstream.cli.gc, "collect_garbage", collect_garbage)
    with pytest.raises(KeyError, match="versions") as raised:
        main(["gc", str(tmp_path)])
    assert isinstance(raised.value.__context__, FileNotFoundError)  # the OSError was there, and is not blamed
    assert _os_error_in(raised.value) is None


def test_an_oserror_named_as_the_cause_is_the_io_failure(tmp_path: Path) -> None:
    cause = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x"))
    try:
        raise ValueError("cannot read the shard") from cause
    except ValueError as error:
        assert _os_error_in(error) is cause


@pytest.mark.slow
def test_a_missing_input_file_inside_a_beam_pipeline_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("sparse linear algebra solvers\nmolecular dynamics\n")
    missing = tmp_path / "deleted-after-listing.txt"
    real_expand = maskstream.pipelines.read_corpus.expand_inputs
    # The file is listed when the pipeline is built and gone when a worker opens it.
    monkeypatch.setattr(maskstream.pipelines.read_corpus, "expand_inputs", lambda patterns: real_expand(patterns) + [str(missing)])
    assert main(["stats", "--input", str(corpus), "--output", str(tmp_path / "stats")]) == EXIT_OS_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("maskstream stats: error: ") and str(missing) in err[-1]
    assert "Traceback" not in err[-1] and "while running" not in err[-1]

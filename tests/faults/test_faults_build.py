"""`maskstream build` under faults: killed mid-write, and seeds it must not use.

(`tests/pipelines/test_build.py` covers a build killed early and one whose shard write fails, and
`maskstream inspect` naming a corrupted shard; here the kill comes while the shards are being
written, and the rerun is checked.)
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from maskstream.cli import main
from maskstream.schemas.manifest import LATEST_POINTER, MANIFEST_NAME, load_manifest
from maskstream.trainer.dataset import StreamingSequenceDataset
from tests.pipelines.test_build import REPO_ROOT, build_args, make_inputs, read_rows


@pytest.mark.slow
def test_a_build_killed_while_writing_shards_leaves_the_previous_version_and_a_rerun_succeeds(
    sample_corpus: Path, tmp_path: Path, subprocess_env, capsys, tiny_encoder
) -> None:
    inputs = make_inputs(sample_corpus, tmp_path / "in", 60)
    root = tmp_path / "dataset"
    # The tiny encoder: the kill comes once shards are being written, after every word is encoded.
    shards = ["--num-shards", "4", "--encoder-threads", "1", "--model", tiny_encoder]
    assert main(build_args(inputs, str(root), "--version", "good", *shards)) == 0
    good_rows = read_rows(str(root / "good"))

    command = [sys.executable, "-m", "maskstream", *build_args(inputs, str(root), "--version", "killed", *shards)]
    process = subprocess.Popen(command, env=subprocess_env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    while not list((root / "killed").glob("shard-*")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)  # the launcher and its workers, mid-write
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the build ended before it could be killed mid-write"
    assert list((root / "killed").glob("shard-*"))
    assert not (root / "killed" / MANIFEST_NAME).exists()

    # The previous version is intact: `latest`, inspect's checksums, the trainer's reader.
    assert (root / LATEST_POINTER).read_text().strip() == "good"
    assert main(["inspect", str(root), "--plot", str(tmp_path / "p.png")]) == 0
    assert "all 4 shards match the manifest" in capsys.readouterr().out
    assert len(list(StreamingSequenceDataset(str(root), shuffle=False))) == good_rows.num_rows
    # The half-written version is never read as a dataset, and never overwritten.
    with pytest.raises(Exception, match="holds neither manifest.json nor a 'latest' pointer"):
        load_manifest(str(root / "killed"))
    assert main(build_args(inputs, str(root), "--version", "killed", *shards)) == 2

    # A rerun succeeds, and gives the same rows as the build before the kill.
    assert main(build_args(inputs, str(root), "--version", "rerun", *shards)) == 0
    assert (root / LATEST_POINTER).read_text().strip() == "rerun"
    assert read_rows(str(root / "rerun")).equals(good_rows)


@pytest.mark.parametrize(
    ("seeds", "formulas", "message"),
    [
        (["protein", "##ing", "molecular"], {}, "not words under nfkc-lower-alnum-v1 .*'##ing'"),
        (["Ġprotein", "▁molecular"], {}, "'Ġprotein', '▁molecular'"),
        (["Protein", "astronomy"], {}, "'Protein'"),
        (["protein"], {"word_normalization": "wordpiece-bert-base-cased"}, "made with word normalization"),
    ],
)
def test_seeds_from_another_tokenizer_are_refused(sample_corpus: Path, tmp_path: Path, caplog, seeds, formulas,
                                                  message) -> None:
    inputs = make_inputs(sample_corpus, tmp_path / "in", 10)
    Path(inputs["seeds"]).write_text(json.dumps({"seeds": [{"word": w} for w in seeds], "formulas": formulas}))
    root = tmp_path / "dataset"
    caplog.set_level(logging.ERROR)
    assert main(build_args(inputs, str(root))) == 2
    assert any(re.search(message, r.getMessage()) for r in caplog.records), caplog.text
    assert not root.exists() or not any(root.iterdir())  # refused before anything was written

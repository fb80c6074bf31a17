"""A training process killed (SIGKILL) mid-epoch resumes exactly.

`tests/trainer/test_train.py` resumes in-process from a copied checkpoint; here a real
`maskstream train` process is killed while it trains, and `--resume` in a new process must give
the same loss at every step, and the same final weights, as a run that was never interrupted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from testing import sequence_dataset as factory
from tests.conftest import REPO_ROOT

STEPS, SAVE_EVERY = 20, 5


@pytest.fixture(scope="module")
def short_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """120 descriptions, 64 tokens at most, 3 shards: 15 steps of 8 rows per epoch."""
    root = tmp_path_factory.mktemp("train-dataset")
    factory.write_dataset(str(root), factory.sequence_rows(factory.read_texts(limit=120), max_length=64), shards=3,
                          row_group_size=20)
    return str(root)


def train_command(dataset: str, model: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "maskstream", "train", "--dataset", dataset, "--output", str(out), "--model", model,
            "--batch-size", "8", "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--num-workers", "2",
            "--learning-rate", "1e-3", "--eval-samples", "8", "--eval-every", "1000", "--log-every", "1", *extra]


def train_losses(out: Path) -> dict[int, float]:
    from maskstream.trainer.metrics import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(out) if r["split"] == "train"}


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "checkpoints" / f"step-{STEPS:08d}" / "model.safetensors")


@pytest.mark.slow
def test_a_trainer_killed_mid_epoch_resumes_exactly(short_dataset: str, tiny_bert: str, tmp_path: Path,
                                                    subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "OMP_NUM_THREADS": "1"}
    uninterrupted = tmp_path / "uninterrupted"
    result = subprocess.run(train_command(short_dataset, tiny_bert, uninterrupted), env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = train_losses(uninterrupted)
    assert sorted(expected) == list(range(1, STEPS + 1))

    killed = tmp_path / "killed"
    process = subprocess.Popen(train_command(short_dataset, tiny_bert, killed), env=env, cwd=REPO_ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    latest = killed / "checkpoints" / "latest"
    while not latest.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)  # the trainer and its loader workers, between two steps or in one
    process.wait()
    assert process.returncode == -signal.SIGKILL, "training ended before it could be killed"
    resumed_from = int(latest.read_text().strip().removeprefix("step-"))
    assert 0 < resumed_from < 15, "the kill must come mid-epoch (15 steps per epoch)"

    result = subprocess.run(train_command(short_dataset, tiny_bert, killed, "--resume"), env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {latest.parent / f'step-{resumed_from:08d}'}" in result.stderr
    # Every step's loss, before and after the kill, is the uninterrupted run's: exactly, not approximately.
    assert train_losses(killed) == expected
    mine, theirs = final_weights(killed), final_weights(uninterrupted)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_a_dataset_from_another_tokenizer_is_refused(short_dataset: str, tiny_bert: str, tmp_path: Path) -> None:
    """Same vocabulary size, one token different: the ids would mean other tokens, so training refuses."""
    import json
    import shutil

    from transformers import AutoTokenizer

    from maskstream.cli import main
    from maskstream.schemas.manifest import vocab_hash

    root = Path(shutil.copytree(short_dataset, tmp_path / "dataset"))
    vocab = AutoTokenizer.from_pretrained(tiny_bert).get_vocab()
    other = {("[unused0]" if token == "protein" else token): i for token, i in vocab.items() if token != "[unused0]"}
    other["protein"] = vocab["[unused0]"]  # two tokens swap ids
    manifest_path = root / "v1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["tokenizer"]["vocab_hash"] == vocab_hash(vocab)
    manifest["tokenizer"]["vocab_hash"] = vocab_hash(other)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="was tokenized with another vocabulary .* build the dataset with this model"):
        main(["train", "--dataset", str(root), "--output", str(tmp_path / "run"), "--model", tiny_bert,
              "--max-steps", "1", "--num-workers", "0"])
    assert not (tmp_path / "run" / "checkpoints").exists()

"""A `train --follow-latest` run that moved on to a newer version resumes exactly (issue 31).

One uninterrupted run starts on v1 while `latest` names v2: after v1's first epoch (step 3) it
switches to v2. Its checkpoints, taken after every step, stand for a run killed there. Resumed
from the end of v1's epoch (before the switch) or from inside v2, with `--dataset` at the first
version, the root or the version being read, each continues with the same losses and ends with the
same weights; the ways it cannot continue exit naming why.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from maskstream.cli import main
from maskstream.trainer import checkpoint
from maskstream.trainer import train as train_loop
from maskstream.trainer.metrics import read_metrics
from testing.sequence_dataset import read_texts, sequence_rows, write_dataset

# 6 batches of 8 per epoch, 2 per step: 3 steps per epoch; epoch 0 reads v1, epochs 1 and 2 v2.
RUN = ["--batch-size", "8", "--grad-accumulation", "2", "--max-steps", "8", "--num-workers", "0",
       "--learning-rate", "1e-3", "--log-every", "1", "--eval-every", "4", "--eval-samples", "8",
       "--held-out-fraction", "0.1", "--seed", "3"]


@pytest.fixture(scope="module")
def followed(tmp_path_factory, tiny_bert: str) -> tuple[Path, Path]:
    """(the dataset root: v1, v2 and `latest` -> v2; the uninterrupted run's output, a checkpoint per step)."""
    root = tmp_path_factory.mktemp("versions")
    rows = sequence_rows(read_texts(limit=96), max_length=48)
    write_dataset(str(root), rows[:48], shards=2, row_group_size=8, version="v1")
    write_dataset(str(root), rows[48:], shards=2, row_group_size=8, version="v2")
    out = tmp_path_factory.mktemp("uninterrupted")
    with pytest.MonkeyPatch.context() as patch:  # keep every checkpoint, not the newest two
        patch.setattr(train_loop, "save_checkpoint", functools.partial(checkpoint.save_checkpoint, keep=0))
        train(root / "v1", out, tiny_bert, "--follow-latest", "--save-every", "1")
    return root, out


def train(dataset: Path, out: Path, model: str, *extra: str) -> None:
    assert main(["train", "--dataset", str(dataset), "--output", str(out), "--model", model, *RUN, *extra]) == 0


def killed_at(run: Path, step: int, out: Path) -> Path:
    """An output folder as a run killed right after checkpoint `step` left it."""
    name = f"step-{step:08d}"
    shutil.copytree(run / "checkpoints" / name, out / "checkpoints" / name)
    (out / "checkpoints" / "latest").write_text(name + "\n")
    return out


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out) if r["split"] == "train"}


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints" / "step-00000008" / "model.safetensors"))


def loader_version(out: Path, step: int) -> str:
    state = torch.load(out / "checkpoints" / f"step-{step:08d}" / "training_state.pt", weights_only=True)
    return state["loader"][0]["version"]


@pytest.mark.slow
def test_the_uninterrupted_run_switches_after_its_first_epoch(followed):
    _, run = followed
    assert [loader_version(run, s) for s in range(1, 9)] == ["v1"] * 3 + ["v2"] * 5
    epochs = {r["step"]: r["epoch"] for r in read_metrics(run) if r["split"] == "train"}
    assert [epochs[s] for s in range(1, 9)] == [0, 0, 0, 1, 1, 1, 2, 2]


@pytest.mark.slow
@pytest.mark.parametrize(("step", "dataset", "follow"), [
    (3, "v1", True),  # killed at v1's epoch end, before the switch: resuming switches first
    (4, "v1", True),  # after the switch, the command line the run started with
    (5, "", True),  # the root
    (5, "v2", False),  # the version being read, no longer following
])
def test_resume_after_a_version_switch_continues_exactly(followed, tiny_bert, tmp_path, step, dataset, follow):
    root, run = followed
    resumed = killed_at(run, step, tmp_path / "resumed")
    train(root / dataset if dataset else root, resumed, tiny_bert, "--resume", *(["--follow-latest"] if follow else []))
    expected, actual = losses(run), losses(resumed)
    assert sorted(actual) == list(range(step + 1, 9))
    assert [actual[s] for s in actual] == [expected[s] for s in actual]  # exactly, not approx
    weights, expected_weights = final_weights(resumed), final_weights(run)
    assert sorted(weights) == sorted(expected_weights)
    assert all(torch.equal(weights[name], expected_weights[name]) for name in weights)
    assert loader_version(resumed, 8) == "v2"


@pytest.mark.slow
def test_resume_that_cannot_continue_exactly_says_why(followed, tiny_bert, tmp_path, tmp_path_factory):
    root, run = followed
    resumed = killed_at(run, 5, tmp_path / "resumed")
    with pytest.raises(SystemExit, match=r"was reading .*v2 \(the run started on .*v1 and followed the latest "
                                         r"version\); --dataset .*v1 names the first version: resume with"):
        train(root / "v1", resumed, tiny_bert, "--resume")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    with pytest.raises(SystemExit, match="is neither that version nor its root"):
        train(elsewhere, resumed, tiny_bert, "--resume", "--follow-latest")
    (root / "v1").rename(root / "v1-collected")  # the first version collected: its held-out rows are gone
    try:
        with pytest.raises(SystemExit, match=r"v1 \(the held-out rows' version\) is no longer a complete version"):
            train(root, resumed, tiny_bert, "--resume", "--follow-latest")
    finally:
        (root / "v1-collected").rename(root / "v1")

"""`maskstream train --resume` on another number of ranks (torchrun, gloo on CPU), workers or batch
size: across the resume every sample of the epoch is trained exactly once, but for the remainder
policy's repeats, as `--sample-log` records them."""

from __future__ import annotations

import collections
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from maskstream.cli import main
from testing.sequence_dataset import read_texts, sequence_rows, write_dataset

STEPS = 24  # every run's schedule, with a checkpoint every 3 steps: the newest two, 21 and 24, are kept
RESUMED_AT = 21  # the first run is resumed from its step-21 checkpoint, as if it had stopped there


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """A dataset of the shipped descriptions, by number of rows."""
    made: dict[int, str] = {}

    def of(rows: int) -> str:
        if rows not in made:
            root = tmp_path_factory.mktemp(f"elastic-{rows}")
            write_dataset(str(root), sequence_rows(read_texts(limit=rows), max_length=32), shards=3,
                          row_group_size=20)
            made[rows] = str(root)
        return made[rows]

    return of


def train(dataset: str, out: Path, model: str, env: dict[str, str], cwd: Path, *, ranks: int, workers: int,
          batch: int, resume: Path | None = None, mix: list[str] = (), extra: list[str] = (),
          epochs: int | None = None) -> list[dict]:
    """Runs `maskstream train` (under torchrun with more than one rank) for STEPS steps, or `epochs`;
    returns its sample log."""
    length = ["--max-steps", str(STEPS)] if epochs is None else ["--epochs", str(epochs)]
    args = ["train", "--dataset", dataset, "--output", str(out), "--model", model, "--batch-size", str(batch),
            "--num-workers", str(workers), *length, "--save-every", "3", "--held-out-fraction", "0",
            "--eval-every", "1000", "--log-every", "5", "--sample-log", str(out / "samples.jsonl")]
    for entry in mix:
        args += ["--mix", entry]
    args += list(extra)
    if resume is not None:
        args += ["--resume", str(resume)]
    out.mkdir(parents=True, exist_ok=True)
    if ranks == 1:
        assert main(args) == 0
    else:
        result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                 str(ranks), "-m", "maskstream", *args], env={**env, "OMP_NUM_THREADS": "1"},
                                cwd=cwd, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


# (ranks, workers, batch) of the first run and of the resumed one, and the dataset's rows: the
# first run is still in epoch 0 at step 21, and the 3 steps left finish it on the new layout.
CASES = {
    "2 ranks -> 1": ((2, 0, 8), (1, 0, 8), 350),
    "1 rank -> 3, with a remainder": ((1, 0, 8), (3, 0, 8), 200),
    "2 workers -> 0": ((1, 2, 8), (1, 0, 8), 190),
    "batch 8 -> 12": ((1, 0, 8), (1, 0, 12), 200),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_resume_on_another_layout_trains_each_sample_once(case, datasets, tiny_bert, tmp_path, subprocess_env,
                                                          repo_root):
    (ranks, workers, batch), (ranks_after, workers_after, batch_after), rows = CASES[case]
    dataset = datasets(rows)
    first = train(dataset, tmp_path / "first", tiny_bert, subprocess_env, repo_root, ranks=ranks, workers=workers,
                  batch=batch)
    checkpoint = tmp_path / "first" / "checkpoints" / f"step-{RESUMED_AT:08d}"
    before = [r for r in first if r["step"] <= RESUMED_AT]
    assert len(before) == RESUMED_AT * ranks * batch and {r["epoch"] for r in before} == {0}
    after = train(dataset, tmp_path / "resumed", tiny_bert, subprocess_env, repo_root, ranks=ranks_after,
                  workers=workers_after, batch=batch_after, resume=checkpoint)
    assert min(r["step"] for r in after) == RESUMED_AT + 1 and {r["rank"] for r in after} == set(range(ranks_after))
    epoch0 = [r for r in after if r["epoch"] == 0]
    left = rows - len(before)
    padded = -left % ranks_after  # the remainder policy on what was left: repeats from its start
    counts = collections.Counter(r["sample_index"] for r in before + epoch0)
    assert set(counts) == set(range(rows)), f"skipped: {sorted(set(range(rows)) - set(counts))}"
    assert sum(c - 1 for c in counts.values()) == padded
    # Every new rank trained the same number of the epoch's samples.
    per_rank = collections.Counter(r["rank"] for r in epoch0)
    assert len(set(per_rank.values())) == 1 and sum(per_rank.values()) == left + padded
    assert len({r["source"] for r in before + after}) == 1  # the version's name


# --epochs 1 on rows the checkpoint's steps do not fit after the resume (issue 53), resumed from the
# older of the two checkpoints kept: 377 rows on 2 x 8 (24 steps) resumed at step 21 on one rank
# leave 41 rows, 6 steps where the checkpoint's plan had 3 (24 rows); 201 rows on 1 x 8 (26 steps)
# resumed at 24 on 2 ranks x 5 leave 9 rows, one step where the checkpoint's plan had 2.
EPOCH_CASES = {
    "2 ranks -> 1": ((2, 0, 8), (1, 0, 8), 377),
    "1 rank -> 2, batch 8 -> 5": ((1, 0, 8), (2, 0, 5), 201),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EPOCH_CASES))
def test_a_run_of_one_epoch_resumed_on_another_layout_finishes_the_epoch(case, datasets, tiny_bert, tmp_path,
                                                                         subprocess_env, repo_root):
    (ranks, workers, batch), (ranks_after, workers_after, batch_after), rows = EPOCH_CASES[case]
    dataset = datasets(rows)
    first = train(dataset, tmp_path / "first", tiny_bert, subprocess_env, repo_root, ranks=ranks, workers=workers,
                  batch=batch, epochs=1)
    assert {r["epoch"] for r in first} == {0} and len(first) == ranks * math.ceil(rows / ranks)
    checkpoint = sorted((tmp_path / "first" / "checkpoints").glob("step-*"))[0]
    resumed_at = int(checkpoint.name.split("-")[1])
    after = train(dataset, tmp_path / "resumed", tiny_bert, subprocess_env, repo_root, ranks=ranks_after,
                  workers=workers_after, batch=batch_after, resume=checkpoint, epochs=1)
    before = [r for r in first if r["step"] <= resumed_at]
    left = rows - len(before)
    assert {r["epoch"] for r in after} == {0}, "trained past the epoch"
    counts = collections.Counter(r["sample_index"] for r in before + after)
    assert set(counts) == set(range(rows)), f"skipped: {sorted(set(range(rows)) - set(counts))}"
    assert len(after) == left + (-left % ranks_after)  # the remainder policy's repeats only
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["samples"] == len(before) + len(after) == summary["config"]["total_samples"]
    assert summary["steps"] == resumed_at + math.ceil(math.ceil(left / ranks_after) / batch_after)
    last = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["learning_rate"] == 0.0 and last["samples"] == summary["samples"]


@pytest.mark.slow
def test_a_mixture_resumes_on_fewer_ranks_taking_each_sample_once(datasets, tiny_bert, tmp_path, subprocess_env,
                                                                  repo_root):
    """2 ranks -> 1 on a 0.8/0.2 mixture of 280 domain rows and 70 text records: by step 21 the ranks
    have taken about 269 and 67 of them, each its own count, and the 3 steps left finish both epochs.
    With --follow-latest (no newer version comes): the ranks poll and gather their versions together."""
    text = tmp_path / "general.jsonl"
    text.write_text("".join(json.dumps({"text": t}) + "\n" for t in read_texts(limit=350)[280:]))
    dataset, mix = datasets(280), [f"{text}:0.2"]
    first = train(dataset, tmp_path / "first", tiny_bert, subprocess_env, repo_root, ranks=2, workers=0, batch=8,
                  mix=mix, extra=["--follow-latest"])
    before = [r for r in first if r["step"] <= RESUMED_AT]
    after = train(dataset, tmp_path / "resumed", tiny_bert, subprocess_env, repo_root, ranks=1, workers=0, batch=8,
                  mix=mix, extra=["--follow-latest"],
                  resume=tmp_path / "first" / "checkpoints" / f"step-{RESUMED_AT:08d}")
    assert min(r["step"] for r in after) == RESUMED_AT + 1 and len(after) == (STEPS - RESUMED_AT) * 8
    names = sorted({r["source"] for r in before + after})
    assert len(names) == 2 and names[0].endswith("general.jsonl")
    for name, size in ((names[1], 280), (names[0], 70)):
        epoch0 = [r["sample_index"] for r in before + after if r["source"] == name and r["epoch"] == 0]
        counts = collections.Counter(epoch0)
        assert set(counts) == set(range(size)) and max(counts.values()) == 1, (name, len(epoch0))
        assert any(r["source"] == name and r["epoch"] == 0 for r in after)  # the rest was trained after the resume

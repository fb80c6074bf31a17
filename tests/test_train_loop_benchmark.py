"""benchmarks/train_loop.py (issue 75): too few --steps is refused by name, both sides run on --device,
the product's progress bar stays off, and the ceiling trains and counts the rows the product would. Cheap:
no training here; the benchmark itself runs by hand."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks import train_loop as benchmark
from maskstream.trainer import train as train_module
from maskstream.trainer.held_out import held_out
from maskstream.trainer.world import World
from testing.sequence_dataset import read_texts, sequence_rows, write_dataset


def test_too_few_steps_for_a_timed_window_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as refused:
        benchmark.parse_args(["--steps", "29"])
    assert refused.value.code == 2
    assert "--steps 29: at least 30; the product's medians leave out its first 2 metrics windows" in capsys.readouterr().err
    assert benchmark.parse_args(["--steps", "30"]).steps == 30
    assert benchmark.parse_args([]).steps is None  # the device's default


def test_the_product_runs_on_the_benchmarks_device_without_its_progress_bar(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine: `train` would take CUDA
    with benchmark.on_device_quietly(torch.device("cpu")):
        assert World.detect().device == torch.device("cpu")
        # as train.py calls it, rank 0 included
        assert train_module.tqdm(total=3, disable=False).disable
    assert World.detect().device.type == "cuda"


def test_the_ceiling_trains_the_rows_the_product_would(tmp_path) -> None:
    root = tmp_path / "dataset"
    write_dataset(str(root), sequence_rows(read_texts(limit=150), max_length=48), shards=2, row_group_size=25)
    config = dataclasses.replace(benchmark.cli_config(str(root), tmp_path / "out", "unused", 30, 0, False),
                                 held_out_fraction=0.1)
    batch = benchmark.trained_batch(config)
    rows = batch["sample_index"].numpy()
    assert "rows_read" not in batch and not held_out(rows, 0.1).any()
    assert 0 < len(rows) < benchmark.BATCH  # some of the 64 rows read were held out, and are not counted

"""What `maskstream train`'s loop moves to the device: the DataLoader's own batches, untouched (pinned on a
GPU, so the copy is queued and the host runs ahead), and nothing inside a step waits for the device.

On the CPU the identity of the tensors is checked; with CUDA, also `is_pinned()` on each and several steps
under `torch.cuda.set_sync_debug_mode("error")` (which cannot see a pageable copy: hence both)."""

from __future__ import annotations

import pytest
import torch

from maskstream.cli import main
from maskstream.trainer import train as train_module
from maskstream.trainer.held_out import held_out
from maskstream.trainer.loader import StreamingDataLoader
from maskstream.trainer.metrics import read_metrics
from testing.sequence_dataset import read_texts, sequence_rows, write_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """150 real descriptions, 48 tokens at most (padded batches), 2 shards."""
    root = tmp_path_factory.mktemp("transfer")
    write_dataset(str(root), sequence_rows(read_texts(limit=150), max_length=48), shards=2, row_group_size=25)
    return str(root)


def record_transfers(monkeypatch) -> tuple[list[dict], list[dict]]:
    """(the batches the DataLoader yielded, the batches the loop handed to `to_device`), recorded."""
    yielded, moved = [], []
    loader_iter, to_device = StreamingDataLoader.__iter__, train_module.to_device

    def recording_iter(self):
        for batch in loader_iter(self):
            yielded.append(dict(batch))
            yield batch

    def recording_to_device(batch, device):
        moved.append(dict(batch))
        return to_device(batch, device)

    monkeypatch.setattr(StreamingDataLoader, "__iter__", recording_iter)
    monkeypatch.setattr(train_module, "to_device", recording_to_device)
    return yielded, moved


def run(dataset: str, model: str, out, *extra: str) -> None:
    # Batch 7 of ~147 training rows, a held-out share that leaves holes in most batches, and a run
    # that crosses an epoch.
    assert main(["train", "--dataset", dataset, "--output", str(out), "--model", model, "--batch-size", "7",
                 "--max-steps", "25", "--held-out-fraction", "0.1", "--eval-samples", "4", "--log-every", "5",
                 *extra]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_loop_moves_the_loaders_own_tensors(dataset, tiny_bert, tmp_path, monkeypatch, workers):
    yielded, moved = record_transfers(monkeypatch)
    run(dataset, tiny_bert, tmp_path / "run", "--num-workers", workers, "--sample-log", str(tmp_path / "rows.jsonl"))
    assert len(moved) == 25
    own = {id(tensor) for batch in yielded for tensor in batch.values() if isinstance(tensor, torch.Tensor)}
    for batch in moved:
        assert batch and all(id(tensor) in own for tensor in batch.values())  # the very objects, no copy
        assert "masked_positions" in batch and "rows_read" not in batch
        assert not held_out(batch["sample_index"].numpy(), 0.1).any()
    trained = [r["samples"] for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
    # The plan counts every row read, held-out ones included: those trained and those the workers dropped.
    assert trained[-1] == sum(len(b["sample_index"]) for b in moved) + _dropped(yielded, moved)


def _dropped(yielded: list[dict], moved: list[dict]) -> int:
    """Held-out rows of the batches trained on: what the plan counts besides the rows trained."""
    trained_ids = {id(b["sample_index"]) for b in moved}
    wholly = sum(b["rows_read"] for b in yielded if "sample_index" not in b)
    partly = sum(b["rows_read"] - len(b["sample_index"]) for b in yielded
                 if "sample_index" in b and id(b["sample_index"]) in trained_ids)
    return wholly + partly


# slow: it trains (tests/conftest.py refuses a training step elsewhere); gpu: else it runs pinned to the CPU.
@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_step_moves_pinned_memory_and_never_waits_for_the_device(dataset, tiny_bert, tmp_path,
                                                                               monkeypatch):
    _, moved = record_transfers(monkeypatch)
    step = train_module.train_step

    def step_without_sync(*args, **kwargs):
        if args[0] > 2:  # the first steps start the loader's workers and the CUDA libraries
            torch.cuda.set_sync_debug_mode("error")
        try:
            return step(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(train_module, "train_step", step_without_sync)
    run(dataset, tiny_bert, tmp_path / "gpu", "--num-workers", "2")
    assert all(t.is_pinned() for batch in moved for t in batch.values())
    packed = [b for b in moved if bool(b["attention_mask"].all())]
    assert len(moved) == 25 and len(packed) < len(moved)  # padded batches were checked too

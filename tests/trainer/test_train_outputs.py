"""`maskstream train`'s numbers stay as recorded: a fixed tiny run's loss values and final weights.

Checkpoints and metrics hold timings and host names, so the run is compared by what it computes:
every logged training and held-out loss, and each weight tensor's sum and norm. A change that
alters what training computes on purpose (another mask draw, another schedule) records the new
values in the same commit and says why:

    MASKSTREAM_RECORD_TRAIN_OUTPUTS=1 python -m pytest tests/trainer/test_train_outputs.py

The tolerance absorbs another CPU's float rounding (other SIMD kernels); a change in which rows,
masks or dropout a step draws moves the losses by orders of magnitude more. Where torch has CUDA the
run stays on the CPU (tests/conftest.py pins every test not marked gpu), so as not to meet bf16 on a GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from maskstream.cli import main
from maskstream.trainer.metrics import read_metrics
from testing.sequence_dataset import read_texts, sequence_rows, write_dataset

RECORDED = Path(__file__).with_name("recorded_train_outputs.json")
RECORD = os.environ.get("MASKSTREAM_RECORD_TRAIN_OUTPUTS") == "1"

# 6 batches of 8 per epoch, 2 per step: the 8 steps cross two epoch boundaries; evaluation and
# checkpoints every 3 steps, 2 loader workers drawing the masks.
RUN = ["--batch-size", "8", "--grad-accumulation", "2", "--max-steps", "8", "--num-workers", "2",
       "--learning-rate", "1e-3", "--warmup-ratio", "0.25", "--log-every", "1", "--eval-every", "3",
       "--save-every", "3", "--eval-samples", "8", "--held-out-fraction", "0.1", "--seed", "7"]
RUNS = {
    "difference": [],
    "span_exlm": ["--strategy", "span", "--objective", "exlm", "--exlm-states", "2"],
    # v1 named directly, `latest` -> v2: the first epoch boundary moves on to v2.
    "follow_latest": ["--follow-latest"],
}


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory) -> Path:
    """A root with v1 (48 Debian descriptions) and v2 (the next 48), `latest` -> v2."""
    root = tmp_path_factory.mktemp("versions")
    rows = sequence_rows(read_texts(limit=96), max_length=48)
    write_dataset(str(root), rows[:48], shards=2, row_group_size=8, version="v1")
    write_dataset(str(root), rows[48:], shards=2, row_group_size=8, version="v2")
    return root


def outputs_of(out: Path) -> dict:
    """The run's losses (per logged step) and, per weight tensor of its last checkpoint, sum and norm."""
    records = read_metrics(out)
    weights = load_file(str(out / "checkpoints" / "step-00000008" / "model.safetensors"))
    return {
        "train_loss": {str(r["step"]): r["loss"] for r in records if r["split"] == "train"},
        "held_out_loss": {str(r["step"]): r["loss"] for r in records if r["split"] == "held_out"},
        "weights": {name: [float(t.double().sum()), float(t.double().norm())] for name, t in sorted(weights.items())},
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_train_computes_the_recorded_losses_and_weights(name, two_versions, tiny_bert, tmp_path):
    out = tmp_path / name
    assert main(["train", "--dataset", str(two_versions / "v1"), "--output", str(out), "--model", tiny_bert,
                 *RUN, *RUNS[name]]) == 0
    actual = outputs_of(out)
    recorded = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    if RECORD:
        recorded[name] = actual
        RECORDED.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    expected = recorded[name]
    assert sorted(actual["train_loss"], key=int) == [str(s) for s in range(1, 9)]
    assert actual["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5)
    assert actual["held_out_loss"] == pytest.approx(expected["held_out_loss"], rel=1e-5)
    assert sorted(actual["weights"]) == sorted(expected["weights"])
    for tensor, (total, norm) in expected["weights"].items():
        # abs: a tensor that training leaves at rounding noise (an attention key bias gets no gradient) is noise on another CPU.
        assert actual["weights"][tensor][1] == pytest.approx(norm, rel=1e-4, abs=1e-6), tensor
        assert actual["weights"][tensor][0] == pytest.approx(total, rel=1e-4, abs=1e-4), tensor
    if name == "follow_latest":
        epochs = {r["step"]: r["epoch"] for r in read_metrics(out) if r["split"] == "train"}
        assert epochs[1] == 0 and epochs[8] == 2
        assert torch.load(out / "checkpoints" / "step-00000008" / "training_state.pt",
                          weights_only=True)["loader"][0]["version"] == "v2"

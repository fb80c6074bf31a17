"""Where torch has CUDA the suite still runs on the CPU, but for the tests marked `gpu`: tests/conftest.py pins
every other test, its session fixtures and its subprocesses, so that recorded CPU numbers are compared with
CPU numbers. These run on any machine: a machine with CUDA is played by patching `torch.cuda.is_available`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from maskstream.trainer.world import World
from tests.conftest import pin_the_cpu

VISIBLE_AT_COLLECTION = os.environ.get("CUDA_VISIBLE_DEVICES")  # before any pin: collection comes first


def test_a_machine_with_cuda_trains_on_the_cpu_once_pinned(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine, unpinned
    assert World.detect().device == torch.device("cuda", 0)
    pin_the_cpu(monkeypatch)
    assert World.detect().device == torch.device("cpu")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_a_test_not_marked_gpu_runs_on_the_cpu(subprocess_env) -> None:
    assert torch.cuda.is_available() is False and World.detect().device == torch.device("cpu")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" == subprocess_env["CUDA_VISIBLE_DEVICES"]


@pytest.mark.slow
def test_its_subprocesses_see_no_gpu() -> None:
    code = "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout == "''\n"


@pytest.mark.gpu
def test_a_test_marked_gpu_sees_the_machine() -> None:
    assert torch.cuda.is_available.__module__ == "torch.cuda"  # torch's own, not the pin's
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == VISIBLE_AT_COLLECTION


def test_the_gpu_transfer_check_may_train_on_the_gpu() -> None:
    """Issue 75: unmarked, the fast-test guard refused its first step, and it failed wherever torch had CUDA."""
    from tests.trainer.test_train_transfer import (
        test_on_a_gpu_the_step_moves_pinned_memory_and_never_waits_for_the_device as check,
    )

    assert {"slow", "gpu", "skipif"} <= {mark.name for mark in check.pytestmark}

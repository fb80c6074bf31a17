"""Checkpoints: safetensors + weights_only state, exact round trip, and no unpickling."""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, get_linear_schedule_with_warmup

from maskstream.trainer.checkpoint import STATE_FILE, load_checkpoint, resolve_checkpoint, save_checkpoint

TINY = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                  max_position_embeddings=32)


def _training_objects(seed: int):
    torch.manual_seed(seed)
    model = BertForMaskedLM(TINY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, 10)
    return model, optimizer, scheduler


def _one_step(model, optimizer, scheduler) -> float:
    ids = torch.randint(0, 64, (4, 8))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def test_round_trip_restores_weights_optimizer_schedule_rngs_and_continues_identically(tmp_path):
    model, optimizer, scheduler = _training_objects(0)
    for _ in range(3):
        _one_step(model, optimizer, scheduler)
    loader_state = {"epoch": 1, "consumed": [5, 7]}
    save_checkpoint(tmp_path, 3, model, optimizer, scheduler, loader_state, {"seed": 0})
    expected = [_one_step(model, optimizer, scheduler) for _ in range(3)]
    python_draw, numpy_draw = random.random(), np.random.random()

    restored, restored_optimizer, restored_scheduler = _training_objects(1)  # different initial weights
    state = load_checkpoint(tmp_path, restored, restored_optimizer, restored_scheduler)
    assert state.step == 3 and state.loader == loader_state and state.settings == {"seed": 0}
    assert restored.get_output_embeddings().weight is restored.get_input_embeddings().weight  # still tied
    assert [_one_step(restored, restored_optimizer, restored_scheduler) for _ in range(3)] == expected
    assert (random.random(), np.random.random()) == (python_draw, numpy_draw)


def test_latest_pointer_and_retention(tmp_path):
    model, optimizer, scheduler = _training_objects(0)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, optimizer, scheduler, {}, {}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002", "step-00000003"]
    assert resolve_checkpoint(tmp_path).name == "step-00000003"
    with pytest.raises(FileNotFoundError, match="latest"):
        resolve_checkpoint(tmp_path / "nothing")


@pytest.mark.slow
def test_checkpoint_written_by_one_process_loads_in_another_with_weights_only(tmp_path, subprocess_env):
    model, optimizer, scheduler = _training_objects(0)
    _one_step(model, optimizer, scheduler)
    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {"epoch": 0}, {"model": "tiny"})
    code = (
        "import sys, torch\n"
        "from safetensors.torch import load_file\n"
        f"state = torch.load({str(path / STATE_FILE)!r}, weights_only=True)\n"
        f"weights = load_file({str(path / 'model.safetensors')!r})\n"
        "print(state['step'], state['config']['model'], len(weights), sorted(state['rng']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True,
                            check=True)
    assert result.stdout.split()[:2] == ["1", "tiny"]
    assert "torch" in result.stdout and "numpy" in result.stdout


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_checkpoint_with_pickled_code_is_refused_and_never_runs(tmp_path, monkeypatch):
    model, optimizer, scheduler = _training_objects(0)
    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {}, {})
    torch.save({"step": 1, "payload": _RunsCode()}, path / STATE_FILE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(tmp_path, model, optimizer, scheduler)
    assert not (tmp_path / "PWNED").exists()


class _Objective(torch.nn.Module):
    """An objective as the trainer has them: a Hugging Face masked LM plus a parameter of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.model = BertForMaskedLM(TINY)
        self.head = torch.nn.Linear(4, 4)


def test_objective_checkpoint_is_a_from_pretrained_folder_and_restores_its_own_parameters(tmp_path):
    from transformers import AutoModelForMaskedLM

    torch.manual_seed(0)
    objective = _Objective()
    optimizer = torch.optim.AdamW(objective.parameters(), lr=1e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, 10)
    path = save_checkpoint(tmp_path, 1, objective, optimizer, scheduler, {}, {})
    reloaded = AutoModelForMaskedLM.from_pretrained(path)
    for name, tensor in objective.model.state_dict().items():
        assert torch.equal(tensor, reloaded.state_dict()[name]), name
    torch.manual_seed(1)
    restored = _Objective()
    load_checkpoint(tmp_path, restored)
    for name, tensor in objective.state_dict().items():
        assert torch.equal(tensor, restored.state_dict()[name]), name


def test_checkpoint_of_the_earlier_layout_still_loads(tmp_path):
    """Before checkpoints were from_pretrained folders, model.safetensors held the whole objective."""
    from safetensors.torch import save_model

    torch.manual_seed(0)
    objective = _Objective()
    optimizer = torch.optim.AdamW(objective.parameters(), lr=1e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, 10)
    path = save_checkpoint(tmp_path, 1, objective, optimizer, scheduler, {}, {})
    for name in ("config.json", "objective.safetensors"):
        (path / name).unlink()
    save_model(objective, str(path / "model.safetensors"))
    torch.manual_seed(1)
    restored = _Objective()
    load_checkpoint(tmp_path, restored)
    for name, tensor in objective.state_dict().items():
        assert torch.equal(tensor, restored.state_dict()[name]), name


def test_a_saved_run_is_read_by_its_typed_fields(tmp_path):
    """The loop reads a checkpoint's settings through `SavedRun` only (issue 75): its plan, epochs, first
    version, samples and tokens trained, and the settings a resume must keep, with what a checkpoint written
    before a setting existed meant by leaving it out; one written before samples were counted, in steps."""
    from maskstream.trainer.checkpoint import read_training_state
    from maskstream.trainer.config import RESUME_CRITICAL
    from maskstream.trainer.plan import Plan

    model, optimizer, scheduler = _training_objects(0)
    settings = {"total_steps": 10, "warmup_steps": 2, "total_samples": 300, "warmup_samples": 60, "epochs": 1.5,
                "dataset_version": "gs://b/data/v3", "grad_accumulation": 2, "seed": 4, "strategy": "random"}
    loader = [{"batch_size": 8, "world_size": 2}]
    save_checkpoint(tmp_path, 4, model, optimizer, scheduler, loader, settings, progress={"samples": 120, "tokens": 99})
    saved = read_training_state(tmp_path)
    assert saved.plan == Plan(10, 2, 300, 60) and saved.epochs == 1.5 and saved.dataset_version == "gs://b/data/v3"
    assert saved.trained == {"samples": 120, "tokens": 99}
    critical = saved.resume_critical()
    assert set(critical) == set(RESUME_CRITICAL) and critical["seed"] == 4 and critical["strategy"] == "random"
    assert critical["mask_budget_schedule"] == "constant" and critical["model"] is None
    older = {k: v for k, v in settings.items() if k not in ("total_samples", "warmup_samples", "epochs")}
    save_checkpoint(tmp_path / "older", 4, model, optimizer, scheduler, loader, older)
    saved = read_training_state(tmp_path / "older")  # 8 rows x 2 ranks x 2 micro-batches a step
    assert saved.plan == Plan(10, 2, 320, 64) and saved.epochs is None
    assert saved.trained == {"samples": 128, "tokens": 0}

"""Checkpoints that let a run continue exactly, stored without pickled Python objects.

Layout of a checkpoint directory (local disk):

    CKPT_DIR/step-00000100/model.safetensors    the Hugging Face model's weights (tied weights stored
                                                once) and, beside them, its config.json: the folder
                                                loads with `AutoModelForMaskedLM.from_pretrained`
    CKPT_DIR/step-00000100/objective.safetensors  the objective's own parameters outside the Hugging
                                                Face model (ExLM's heads), when it has any
    CKPT_DIR/step-00000100/training_state.pt    optimizer, scheduler, loader state, RNG states,
                                                step and run config: tensors and plain containers
    CKPT_DIR/latest                             name of the newest complete checkpoint

A checkpoint is written into a temporary folder and renamed into place, and `latest` is
rewritten last, so a crash never leaves a half-written checkpoint behind `latest`.
Loading uses `safetensors` and `torch.load(..., weights_only=True)`, which refuses anything
but tensors and plain containers: reading a checkpoint never runs code from it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from maskstream.storage.publish import move_into_place, write_atomically
from maskstream.trainer.config import RESUME_CRITICAL, RESUME_DEFAULTS
from maskstream.trainer.plan import Plan
from maskstream.trainer.position import DatasetPosition

MODEL_FILE = "model.safetensors"
OBJECTIVE_FILE = "objective.safetensors"
STATE_FILE = "training_state.pt"
LATEST = "latest"


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU (and CUDA) generator states as tensors and plain containers."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    # weights_only loading turns tuples into lists for some torch versions; random wants tuples.
    random.setstate((python[0], tuple(python[1]), python[2]))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def hf_part(model: torch.nn.Module) -> tuple[torch.nn.Module | None, str]:
    """The Hugging Face model inside a training objective (a child with `save_pretrained` and a
    `config`) and its state-dict prefix: the model itself (prefix ""), else its first such child;
    (None, "") when there is none."""
    def is_hf(module: torch.nn.Module) -> bool:
        return hasattr(module, "save_pretrained") and hasattr(module, "config")

    if is_hf(model):
        return model, ""
    return next(((child, f"{name}.") for name, child in model.named_children() if is_hf(child)), (None, ""))


def _save_weights(model: torch.nn.Module, folder: Path) -> None:
    hf, prefix = hf_part(model)
    if hf is None:
        save_model(model, str(folder / MODEL_FILE))
        return
    # The HF model under its own names, and its config: the folder is a `from_pretrained` folder.
    save_model(hf, str(folder / MODEL_FILE))
    hf.config.save_pretrained(folder)
    extras = {k: v.detach().contiguous() for k, v in model.state_dict().items() if not k.startswith(prefix)}
    if extras:
        save_file(extras, str(folder / OBJECTIVE_FILE))


def _load_weights(model: torch.nn.Module, folder: Path) -> None:
    hf, prefix = hf_part(model)
    with safe_open(str(folder / MODEL_FILE), framework="pt") as f:
        names = f.keys()  # a safe_open handle is not iterable
    whole_objective = hf is None or not prefix or any(k.startswith(prefix) for k in names)
    if whole_objective:  # no HF model inside, or a checkpoint written before the HF layout
        load_model(model, str(folder / MODEL_FILE), strict=True)
        return
    load_model(hf, str(folder / MODEL_FILE), strict=True)
    expected = {k for k in model.state_dict() if not k.startswith(prefix)}
    extras = load_file(str(folder / OBJECTIVE_FILE)) if expected else {}
    if set(extras) != expected:
        raise ValueError(f"{folder / OBJECTIVE_FILE} holds {sorted(extras)}, the objective needs {sorted(expected)}")
    model.load_state_dict(extras, strict=False)


def save_checkpoint(
    checkpoint_dir: str | os.PathLike,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    loader_state: dict[str, Any],
    config: dict[str, Any],
    keep: int = 2,
    progress: dict[str, int] | None = None,
) -> Path:
    """Writes `CKPT_DIR/step-NNNNNNNN` atomically, points `latest` at it, keeps the newest `keep`.
    `scheduler` is None for a loop that sets its learning rate itself; `progress` is what the run has
    trained by `step` (`maskstream train`: samples and tokens)."""
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    final = root / name
    partial = root / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    _save_weights(model, partial)
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "progress": progress or {},
            "loader": loader_state,
            "rng": rng_state(),
            "config": config,
        },
        partial / STATE_FILE,
    )
    shutil.rmtree(final, ignore_errors=True)
    move_into_place(str(partial), str(final))
    write_atomically(str(root / LATEST), (name + "\n").encode("utf-8"))  # what a resume follows
    for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """`path` itself if it is a checkpoint, else the checkpoint its `latest` names."""
    path = Path(path)
    if (path / STATE_FILE).exists():
        return path
    pointer = path / LATEST
    if not pointer.exists():
        raise FileNotFoundError(f"{path} is neither a checkpoint ({STATE_FILE}) nor holds a {LATEST!r} pointer")
    name = pointer.read_text(encoding="utf-8").strip()
    if "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"{pointer} names {name!r}, which is not a checkpoint folder name")
    return path / name


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """A checkpoint's training state, read once (`read_training_state`); the weights stay in its folder."""

    path: str  # the checkpoint folder
    step: int
    settings: dict[str, Any]  # the run's settings and plan as `save_checkpoint` got them (`config` in the file)
    loader: list[dict[str, Any]]  # every rank's loader state (a mixture's hold its sources' under "mixture")
    progress: dict[str, int]  # samples and tokens trained by `step` (empty in checkpoints older than the count)
    rng: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any] | None

    @property
    def positions(self) -> list[DatasetPosition]:
        """Each rank's position in the version it was reading (a mixture's: its domain's)."""
        return [DatasetPosition.of(state) for state in self.loader]

    @property
    def mixed(self) -> bool:
        return "mixture" in self.loader[0]

    @property
    def mixture_states(self) -> list[dict[str, Any]]:
        """Every rank's mixture state (a mixture's ranks take their own rows from each source)."""
        return [state["mixture"] for state in self.loader]

    @property
    def plan(self) -> Plan:
        """The plan the run was training to."""
        return Plan(int(self.settings["total_steps"]), int(self.settings["warmup_steps"]),
                    *self.samples("total_samples", "warmup_samples"))

    @property
    def epochs(self) -> float | None:
        """The epochs the run was planned in; None for a run planned in --max-steps."""
        return self.settings.get("epochs")

    @property
    def dataset_version(self) -> str:
        """The version the run started on (its held-out rows are that version's)."""
        return self.settings["dataset_version"]

    @property
    def trained(self) -> dict[str, int]:
        """Samples and tokens trained by `step`, all ranks (tokens 0 in checkpoints older than their count)."""
        return {"samples": self.samples("samples")[0], "tokens": int(self.progress.get("tokens", 0))}

    def resume_critical(self) -> dict[str, Any]:
        """The settings a resumed run must keep (RESUME_CRITICAL), as the run had them."""
        return {k: self.settings.get(k, RESUME_DEFAULTS.get(k)) for k in RESUME_CRITICAL}

    def samples(self, *keys: str) -> list[int]:
        """Sample counts the run recorded (`samples`, `total_samples`, `warmup_samples`); a checkpoint
        written before they were counted measured in steps: its steps times a full step's rows."""
        first = self.loader[0]
        full_step = first["batch_size"] * first["world_size"] * self.settings["grad_accumulation"]
        steps = {"total_samples": self.settings["total_steps"], "warmup_samples": self.settings["warmup_steps"],
                 "samples": self.step}
        counted = {**self.settings, **self.progress}
        return [int(counted[k]) if k in counted else steps[k] * full_step for k in keys]


def read_training_state(path: str | os.PathLike) -> SavedRun:
    """The stored state of the checkpoint at `path` (or the one its `latest` names). Weights are not read."""
    path = resolve_checkpoint(path)
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    return SavedRun(path=str(path), step=int(state["step"]), settings=state["config"], loader=state["loader"],
                    progress=state.get("progress") or {}, rng=state["rng"], optimizer=state["optimizer"],
                    scheduler=state.get("scheduler"))


def restore_checkpoint(
    state: SavedRun,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> None:
    """Loads the weights of `read_training_state`'s checkpoint into `model`, its states into the optimizer
    and scheduler."""
    _load_weights(model, Path(state.path))
    if optimizer is not None:
        optimizer.load_state_dict(state.optimizer)
    if scheduler is not None and state.scheduler is not None:
        scheduler.load_state_dict(state.scheduler)


def load_checkpoint(
    path: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    restore_rng: bool = True,
) -> SavedRun:
    """Loads weights into `model` (and state into optimizer/scheduler/RNGs); returns the stored state.
    Never unpickles: safetensors and weights_only only."""
    state = read_training_state(path)
    restore_checkpoint(state, model, optimizer, scheduler)
    if restore_rng:
        set_rng_state(state.rng)
    return state

"""The training loop of `maskstream train`: `train(TrainConfig)` streams a dataset version's shards
(training_data.py, dataset.py, loader.py), draws fresh masks (masking.py) and trains a masked LM
with AdamW, a warm-up and linear decay over the samples planned (plan.py), gradient accumulation,
bf16 autocast on CUDA, checkpoints and resume, on one or several ranks (torchrun). What it writes
and how rows are held out: `maskstream train --help` (maskstream/cli/train.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import PreTrainedModel

from maskstream.models import display_name
from maskstream.trainer.checkpoint import (
    SavedRun,
    read_training_state,
    restore_checkpoint,
    save_checkpoint,
)
from maskstream.trainer.config import RESUME_CRITICAL, TrainConfig
from maskstream.trainer.held_out import evaluate
from maskstream.trainer.loader import MASKED_POSITIONS
from maskstream.trainer.masking import MaskingConfig, apply_masking
from maskstream.trainer.metrics import MetricsLogger
from maskstream.trainer.mixture import mask_by_source
from maskstream.trainer.objectives import OBJECTIVES, load_mlm_model
from maskstream.trainer.optimizer import adamw, set_learning_rate
from maskstream.trainer.plan import EpochProgress, Plan, fresh_plan, learning_rate_factor, replan
from maskstream.trainer.position import Layout
from maskstream.trainer.training_data import (
    TrainingData,
    open_data,
    open_mixture,
    setup_world,
)
from maskstream.trainer.world import World

log = logging.getLogger("maskstream.train")
DATA_WAIT_WARNING = 0.05  # a GPU waiting for data longer than this share of a window is worth a line

@dataclasses.dataclass
class MetricsWindow:
    """The training metrics of one logging window, summed as the steps run. The sums stay on the device
    (tensors, or ints the host knows) until the window is logged: adding to them waits for nothing."""

    loss: torch.Tensor | float = 0.0
    correct: torch.Tensor | int = 0
    masked: torch.Tensor | int = 0
    tokens: torch.Tensor | int = 0
    samples: int = 0  # rows trained on this rank
    micro: int = 0  # micro-batches
    wait: float = 0.0  # seconds the host waited for the next batch (`next(batches)`) and queued its transfer
    masking: float = 0.0  # seconds masking in this process (a budget schedule, --mix): on a GPU it may sync
    bookkeeping: float = 0.0  # seconds writing --sample-log lines and counting a mixture's sources
    sources: list[int] | None = None  # a mixture: rows trained from each source
    start: float = dataclasses.field(default_factory=time.perf_counter)


# --- the run ---------------------------------------------------------------------------------


def plan_run(config: TrainConfig, data: TrainingData, saved: SavedRun | None, step: int,
             samples_done: int) -> Plan:
    """How long the run trains (maskstream.trainer.plan), from the loader's progress through its epoch (EpochProgress). A fresh run plans
    --max-steps or --epochs; a resumed one keeps its checkpoint's plan on the same layout, works it out
    again on another world size or batch size (its epochs still end where they should), and with
    --max-steps given now trains to that step."""
    batch, world = config.batch_size, data.world.world_size
    if data.mixture is not None:  # full batches, the domain's rows as the draw gives them
        epoch, rows_left, rows_per_epoch = data.mixture.domain_position()
        progress = EpochProgress(epoch, rows_left, math.ceil(rows_left / batch), rows_per_epoch, batch, world,
                                 domain_rows=data.mixture.domain_rows, samples_done=data.mixture.samples)
    else:
        progress = EpochProgress.of(data.dataset, batch, world)
    accumulation = config.grad_accumulation
    if saved is None:
        return fresh_plan(progress, epochs=config.epochs, max_steps=config.max_steps,
                          grad_accumulation=accumulation, warmup_ratio=config.warmup_ratio)
    before, saved_plan = saved.positions[0].layout, saved.plan
    if config.max_steps:  # to the step asked now
        saved_plan = dataclasses.replace(saved_plan, total_steps=config.max_steps)
    if (before.world_size, before.batch_size) == (world, batch):
        if config.max_steps:
            return replan(saved_plan, step, samples_done, progress, epochs=None, grad_accumulation=accumulation)
        return saved_plan  # the same batches: the plan as it was
    # A run planned in epochs (not --max-steps) ends them on this layout.
    epochs = None if config.max_steps else saved.epochs
    plan = replan(saved_plan, step, samples_done, progress, epochs=epochs, grad_accumulation=accumulation)
    steps_before = saved_plan.total_steps - step
    if epochs is None:
        log.info("elastic resume: the %d step(s) left now cover %d samples, against %d on the checkpoint's layout",
                 steps_before, plan.total_samples - samples_done, saved_plan.total_samples - samples_done)
    else:
        log.info("elastic resume: %d step(s) (%d samples) finish the run's %g epoch(s) on this layout, where the "
                 "checkpoint's %d step(s) left would have covered %d samples", plan.total_steps - step, plan.total_samples - samples_done,
                 epochs, steps_before, progress.samples_of(steps_before * accumulation))
    return plan


def run_settings(config: TrainConfig, data: TrainingData, saved: SavedRun | None) -> dict[str, Any]:
    """What the checkpoints and summary.json record of the run (RESUME_CRITICAL among them; the plan's
    fields are added once it is made). `epochs` is what the run ends on, None for --max-steps (a
    resumed run's are its checkpoint's)."""
    epochs = None if config.max_steps else config.epochs
    if saved is not None and not config.max_steps:
        epochs = saved.epochs
    return {
        "dataset_version": data.started_on, "model": data.model_name, "objective": config.objective,
        "strategy": config.strategy, "mask_budget": config.mask_budget,
        "mask_budget_schedule": str(data.budget_schedule), "whole_word": config.whole_word,
        "batch_size": config.batch_size, "grad_accumulation": config.grad_accumulation, "epochs": epochs,
        "learning_rate": config.learning_rate, "seed": config.seed,
        "world_size": data.world.world_size, "held_out_fraction": config.held_out_fraction,
        "eval_strategy": config.eval_strategy,
    }


@dataclasses.dataclass
class TrainingModel:
    mlm_model: PreTrainedModel  # the Hugging Face masked-LM: what model/ and checkpoints hold
    objective: torch.nn.Module  # the objective around it: what is trained, evaluated and checkpointed
    model: torch.nn.Module  # what the loop calls: the objective, wrapped for DDP and compiled if asked
    optimizer: torch.optim.Optimizer  # its learning rate set before each step from the samples trained (`plan`)


def build_model(config: TrainConfig, data: TrainingData, run_config: dict[str, Any]) -> TrainingModel:
    """The model in its objective and AdamW (no weight decay on biases and norms). ExLM's expansion
    settings are recorded in `run_config`."""
    device = data.world.device
    mlm_model = load_mlm_model(data.model_name)
    options = {}
    if config.objective == "exlm":  # expansion settings (trainer/exlm.py), recorded with the run
        options = {"num_states": config.exlm_states, "token_budget": config.exlm_token_budget,
                   "mask_token_id": data.tokenizer.mask_token_id, "pad_token_id": data.pad_token_id}
        run_config.update(exlm_states=config.exlm_states, exlm_token_budget=config.exlm_token_budget)
    objective = OBJECTIVES[config.objective](mlm_model, **options).to(device)
    optimizer = adamw(objective, config.weight_decay, config.learning_rate, fused=device.type == "cuda")
    return TrainingModel(mlm_model, objective, objective, optimizer)


def read_resume_state(config: TrainConfig) -> SavedRun | None:
    """The checkpoint state to continue from (--resume), None when starting fresh."""
    if not config.resume:
        return None
    return read_training_state(Path(config.output) / "checkpoints" if config.resume == "latest" else config.resume)


def resume(saved: SavedRun, parts: TrainingModel, data: TrainingData, run_config: dict[str, Any]) -> int:
    """Restores weights, optimizer, schedule and loader position; returns the step to continue from."""
    was = saved.resume_critical()
    changed = {k: (was[k], run_config[k]) for k in RESUME_CRITICAL if was[k] != run_config[k]}
    if changed:
        raise SystemExit(f"cannot resume {saved.path} exactly: settings changed (was, now): {changed}")
    restore_checkpoint(saved, parts.objective, parts.optimizer)
    if saved.mixed != (data.mixture is not None):
        raise SystemExit(f"cannot resume {saved.path}: it was {'' if saved.mixed else 'not '}trained on a mixture; "
                         "resume with the same --mix")
    if data.mixture is not None:
        try:  # every rank's state: a mixture's ranks take their own rows from each source
            data.mixture.load_state_dict(saved.mixture_states)
        except (ValueError, OSError) as e:  # other weights, a version gone: say which, in one line
            raise SystemExit(f"cannot resume {saved.path}: {e}") from None
    else:
        data.dataset.load_state_dict(loader_state(saved, data.world.rank, data.world.world_size))
    log.info("resumed from %s at step %d", saved.path, saved.step)
    before = saved.positions[0].layout
    now = Layout(data.world.world_size, data.config.num_workers, data.config.batch_size)
    if before.reading != now.reading:
        log.info("elastic resume: the checkpoint's %d rank(s) x %d worker(s) x batch %d continue as %d x %d x %d; "
                 "the %d samples left of epoch %d are dealt to the new layout", before.world_size, before.num_workers,
                 before.batch_size, now.world_size, now.num_workers, now.batch_size,
                 data.dataset.rows_per_rank() * now.world_size, data.dataset.epoch)
    return saved.step


def loader_state(saved: SavedRun, rank: int, world_size: int) -> dict[str, Any]:
    """The loader state rank `rank` of `world_size` continues from: its own when the world size is the
    checkpoint's, else any rank's (they agree on epoch and batches taken; elastic resume)."""
    if len(saved.loader) == world_size:
        return saved.loader[rank]
    taken = {(p.epoch, p.batches_consumed, len(p.segments)) for p in saved.positions}
    if len(taken) != 1:
        raise SystemExit(f"cannot resume {saved.path} on {world_size} ranks: its ranks disagree on the "
                         f"(epoch, batches, resumes) they had taken: {sorted(taken)}")
    return saved.loader[0]


def wrap_model(parts: TrainingModel, config: TrainConfig, world: World) -> None:
    """DDP across ranks, torch.compile if asked: what the loop calls."""

    if world.world_size > 1:
        parts.model = torch.nn.parallel.DistributedDataParallel(
            parts.model, device_ids=[world.local_rank] if world.device.type == "cuda" else None)
    if config.compile:
        parts.model = torch.compile(parts.model)


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The batch's tensors on `device`. From the DataLoader's pinned memory `non_blocking` queues the
    copy and returns at once; from pageable memory (a copy made in this process) it would wait for the
    device to finish the previous step."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def train_step(step: int, parts: TrainingModel, batches: Iterator[tuple[int, dict[str, Any], int]],
               data: TrainingData, window: MetricsWindow, masking: MaskingConfig) -> tuple[int, int]:
    """One optimizer step over --grad-accumulation micro-batches masked with `masking` (unless the
    loader workers masked them), their sums added to `window`; returns the epoch of its last batch
    and the rows this rank was dealt for it. With masks drawn in the workers nothing here waits for
    the device: the masked positions come with the batch, and whether it holds padding is read on
    the host before the transfer."""

    config, device = data.config, data.world.device
    rows_dealt = 0
    for micro in range(config.grad_accumulation):
        started = time.perf_counter()
        epoch, batch, dealt = next(batches)
        waited = time.perf_counter() - started
        rows_dealt += dealt
        started = time.perf_counter()
        data.log_samples(step, epoch, batch)
        if data.mixture is not None:
            window.sources = [a + b for a, b in zip(window.sources or [0] * len(data.mixture.sources),
                                                    data.mixture.counts(batch), strict=True)]
        window.bookkeeping += time.perf_counter() - started
        attends_all = bool(batch["attention_mask"].all())  # on the host, before the transfer
        window.samples += len(batch["sample_index"])
        started = time.perf_counter()
        batch = to_device(batch, device)
        window.wait += waited + time.perf_counter() - started
        started = time.perf_counter()
        if data.mixture is not None:
            batch = mask_by_source(batch, data.mixture.strategies, masking, seed=config.seed)
        elif not data.mask_in_workers:
            batch = apply_masking(batch, config.strategy, masking, seed=config.seed, epoch=epoch)
        window.masking += time.perf_counter() - started
        # DDP averages gradients across ranks on the last micro-batch of a step only.
        last_micro = micro == config.grad_accumulation - 1
        with parts.model.no_sync() if data.world.world_size > 1 and not last_micro else contextlib.nullcontext():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                out = parts.model(batch["input_ids"], batch["attention_mask"], batch["labels"],
                                  batch.get(MASKED_POSITIONS), attends_all)
            (out["loss"] / config.grad_accumulation).backward()
        window.loss += out["loss"].detach()
        window.correct += out["correct"]
        window.masked += out["masked"]
        window.tokens += batch["attention_mask"].sum()
        window.micro += 1
    torch.nn.utils.clip_grad_norm_(parts.model.parameters(), config.max_grad_norm)
    parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)
    return epoch, rows_dealt


def window_record(window: MetricsWindow, parts: TrainingModel, world: World, epoch: int,
                  names: list[str]) -> dict[str, Any]:
    """The logged training metrics of one window (tokens, samples, correct and masked summed over ranks;
    with a mixture, samples by source). Reading the sums waits for the device: once a window."""

    elapsed = time.perf_counter() - window.start
    # One all-reduce: tokens, samples, correct, masked, then (a mixture) the samples of each source.
    totals = torch.cat([torch.stack([torch.as_tensor(value, dtype=torch.float64, device=world.device)
                                     for value in (window.tokens, window.samples, window.correct, window.masked)]),
                        torch.tensor(window.sources or [], dtype=torch.float64, device=world.device)])
    if world.world_size > 1:
        dist.all_reduce(totals)
    (tokens, samples, correct, masked), counts = totals[:4].tolist(), totals[4:].tolist()
    record = {"loss": float(window.loss) / window.micro, "masked_accuracy": correct / max(masked, 1),
              "learning_rate": parts.optimizer.param_groups[0]["lr"], "tokens_per_second": tokens / elapsed,
              "samples_per_second": samples / elapsed, "data_wait_share": window.wait / elapsed,
              "masking_share": window.masking / elapsed, "bookkeeping_share": window.bookkeeping / elapsed,
              "epoch": epoch, "tokens": int(tokens)}
    if window.sources is not None:  # a mixture: samples trained from each source, all ranks
        record["samples_by_source"] = dict(zip(names, (int(c) for c in counts), strict=True))
    return record


def warn_if_waiting(record: dict[str, Any], config: TrainConfig, device: torch.device) -> bool:
    """Logs one line, and returns True, when a window on a GPU waited for data (`next(batches)` and the
    queued copy: what more loader workers or a cache shorten) more than DATA_WAIT_WARNING of its time.
    Masking in this process and the sample log are timed apart and not judged here: more workers do not
    shorten them. The first window is not judged (the loader workers start in it)."""
    if device.type != "cuda" or record["data_wait_share"] <= DATA_WAIT_WARNING:
        return False
    log.warning("the step waited %.0f %% of the last %d steps for data (data_wait_share): try --num-workers %d, "
                "or --cache-dir for a gs:// dataset", 100 * record["data_wait_share"], config.log_every,
                2 * config.num_workers if config.num_workers else 2)
    return True


def evaluate_held_out(step: int, parts: TrainingModel, data: TrainingData, logger) -> dict[str, float]:
    held = evaluate(parts.objective, data.eval_batches, data.config.eval_strategy, data.eval_masking,
                    data.world.device)
    logger.log(step, "held_out", held)
    log.info("%s: held-out loss %.4f, perplexity %.2f, masked-token accuracy %.4f",
             f"step {step}" if step else "before training", held["loss"], held["perplexity"], held["accuracy"])
    return held


def evaluate_and_checkpoint(step: int, total_steps: int, parts: TrainingModel, data: TrainingData, logger,
                            run_config: dict[str, Any], trained: dict[str, int]) -> dict[str, float] | None:
    """Every --eval-every steps and at the end, the held-out metrics (rank 0; returned, else None);
    every --save-every steps and at the end, a checkpoint (with the samples and tokens `trained`)."""
    config, last = data.config, step == total_steps
    held = None
    if data.world.is_main and data.eval_batches and (step % config.eval_every == 0 or last):
        held = evaluate_held_out(step, parts, data, logger)
    if step % config.save_every == 0 or last:
        loader_states = data.loader_states()
        if data.world.is_main:
            save_checkpoint(Path(config.output) / "checkpoints", step, parts.objective, parts.optimizer,
                            None, loader_states, run_config, progress=dict(trained))
    return held


def save_final(out: Path, step: int, parts: TrainingModel, data: TrainingData, run_config: dict[str, Any],
               held: dict[str, float], trained: dict[str, int]) -> None:
    """model/ (save_pretrained + tokenizer) and summary.json."""
    parts.mlm_model.save_pretrained(out / "model")
    data.tokenizer.save_pretrained(out / "model")
    summary = {"steps": step, **trained, "config": run_config, "held_out": held if data.eval_batches else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log.info("wrote %s (model/, checkpoints/, metrics.jsonl, tensorboard/, summary.json)", out)


def train(config: TrainConfig) -> int:
    """The training loop, top to bottom: set up the ranks, the data and the model (resuming from a
    checkpoint when asked), train, evaluate and checkpoint on schedule, save the final model."""

    world = setup_world(config.seed)
    saved = read_resume_state(config)
    data = open_data(config, world, saved)
    if config.mix:
        data.mixture = open_mixture(data)
    run_config = run_settings(config, data, saved)
    parts = build_model(config, data, run_config)
    step = resume(saved, parts, data, run_config) if saved is not None else 0
    # samples and tokens trained, all ranks: what the schedule follows and the records count
    trained = {"samples": 0, "tokens": 0}
    if saved is not None:
        trained = saved.trained
    plan = plan_run(config, data, saved, step, trained["samples"])
    run_config.update(plan.record())
    wrap_model(parts, config, world)
    out = Path(config.output)
    logger = MetricsLogger(out, resume_step=step if saved is not None else None, enabled=world.is_main)
    if world.is_main:
        log.info("training %s on %s: %d steps, %d samples (%d warm-up), strategy %s, %d rank(s) x batch %d x "
                 "accumulation %d", display_name(data.model_name), data.dataset.version_url, plan.total_steps,
                 plan.total_samples, plan.warmup_samples, config.strategy, world.world_size, config.batch_size,
                 config.grad_accumulation)

    held: dict[str, float] = {}
    if world.is_main and data.eval_batches and saved is None:
        held = evaluate_held_out(0, parts, data, logger)
    batches = data.batches()
    parts.model.train()
    # `disable` for the other ranks only: on rank 0, tqdm's own TQDM_DISABLE=1 still silences the bar
    progress = tqdm(total=plan.total_steps, initial=step, desc="train", unit="step",
                    **({} if world.is_main else {"disable": True}))
    window, warned = MetricsWindow(), False
    set_learning_rate(parts.optimizer, config.learning_rate * learning_rate_factor(trained["samples"], plan))
    while step < plan.total_steps:
        masking = data.masking_at(trained["samples"], plan)
        epoch, rows_dealt = train_step(step + 1, parts, batches, data, window, masking)
        step += 1
        trained["samples"] += rows_dealt * world.world_size  # every rank is dealt as many rows
        set_learning_rate(parts.optimizer, config.learning_rate * learning_rate_factor(trained["samples"], plan))
        progress.update(1)
        # A checkpoint's step is logged too, so that the tokens it records are all counted.
        if step % config.log_every == 0 or step % config.save_every == 0 or step == plan.total_steps:
            record = {**window_record(window, parts, world, epoch, data.source_names), "mask_budget": masking.budget}
            trained["tokens"] += record["tokens"]
            record.update(trained)
            logger.log(step, "train", record)
            progress.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['learning_rate']:.2e}")
            if not warned and step > config.log_every:
                warned = warn_if_waiting(record, config, world.device)
            window = MetricsWindow()
        paused = time.perf_counter()  # evaluation and checkpoints do not count in tokens/s
        held = evaluate_and_checkpoint(step, plan.total_steps, parts, data, logger, run_config, trained) or held
        window.start += time.perf_counter() - paused
    progress.close()

    if world.is_main:
        save_final(out, step, parts, data, run_config, held, trained)
    logger.close()
    if data.sample_log is not None:
        data.sample_log.close()
    if data.mixture is not None:
        data.mixture.close()  # the leases of the domain and of the other sources
    elif data.lease is not None:
        data.lease.release()
    if world.world_size > 1:
        # DDP's reducer holds the process group: freed only after destroy_process_group (when train()'s
        # locals go), gloo's destructor can wait forever on a lock, and a rank hangs after writing its outputs.
        parts.model = parts.objective
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return 0

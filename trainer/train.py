"""The training loop of `maskstream train`: `train(TrainConfig)` streams a dataset version's shards
(dataset.py, loader.py), draws fresh masks (masking.py) and trains a masked LM with AdamW, warm-up
and linear decay, gradient accumulation, bf16 autocast on CUDA, checkpoints and resume, on one or
several ranks (torchrun). What it writes and how rows are held out: `maskstream train --help`
(maskstream/cli/train.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import AutoTokenizer

from maskstream.models import default_model, display_name
from maskstream.schemas.manifest import vocab_hash
from maskstream.storage.lease import VersionLease
from maskstream.trainer.checkpoint import (
    read_training_state,
    restore_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from maskstream.trainer.config import RESUME_CRITICAL, RESUME_DEFAULTS, TrainConfig
from maskstream.trainer.dataset import Layout, StreamingSequenceDataset
from maskstream.trainer.follow import LatestVersionFollower, dataset_root, poll_all_ranks, version_exists
from maskstream.trainer.held_out import collect_held_out, evaluate, held_out, select_rows
from maskstream.trainer.loader import build_dataloader
from maskstream.trainer.masking import BudgetSchedule, MaskingConfig, apply_masking
from maskstream.trainer.metrics import MetricsLogger
from maskstream.trainer.mixture import build_mixture, mask_by_source
from maskstream.trainer.objectives import OBJECTIVES, load_mlm_model
from maskstream.trainer.optimizer import build_optimizer
from maskstream.trainer.shard_cache import ShardCache

log = logging.getLogger("maskstream.train")

def new_window() -> dict[str, Any]:
    """Fresh training-metric sums for one logging window, timed from now."""
    return {"loss": 0.0, "correct": 0, "masked": 0, "tokens": 0, "micro": 0, "wait": 0.0,
            "start": time.perf_counter()}


# --- the run ---------------------------------------------------------------------------------


def shard_cache(config: TrainConfig) -> ShardCache | None:
    """The local shard cache --cache-dir and --cache-limit ask for, or None."""
    if not config.cache_dir:
        return None
    return ShardCache(config.cache_dir, config.cache_limit)


def masks_in_loader_workers(device) -> bool:
    """On CPU the loader workers draw the masks; on a GPU the device does, after the transfer."""
    return device.type == "cpu"


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place among the torchrun ranks, and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: Any  # torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_ranks(seed: int) -> Ranks:
    """Device and process group (torchrun sets RANK, LOCAL_RANK and WORLD_SIZE); seeds torch."""

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.manual_seed(seed)
    return Ranks(rank, world_size, local_rank, device)


def resume_versions(dataset: str, follow_latest: bool, saved: dict[str, Any]) -> tuple[str, str]:
    """(the version the run started on, the version it was reading) for resuming the checkpoint state
    `saved` with `--dataset DATASET`. The held-out rows come from the first, training continues on the
    second: a run that followed newer versions (`--follow-latest`) stops on a later one than it started.
    DATASET may be their root, the version being read, or (with --follow-latest, as the run was
    started) the first version; anything else, or a version the root no longer holds, exits saying why."""

    started = saved["config"]["dataset_version"]
    root = started.rsplit("/", 1)[0]
    reading = f"{root}/{saved['loader'][0]['version']}"  # every rank reads the same version
    given = dataset.rstrip("/")
    where = f"checkpoint {saved['path']} was reading {reading}"
    if reading != started:
        where += f" (the run started on {started} and followed the latest version)"
    if given not in (root, reading, started):
        raise SystemExit(f"cannot resume: {where}; --dataset {dataset} is neither that version nor its root {root}")
    if given == started != reading and not follow_latest:
        raise SystemExit(f"cannot resume: {where}; --dataset {dataset} names the first version: resume with "
                         f"--dataset {root} or {reading}, or with --follow-latest as the run was started")
    for url, role in ((reading, "the version training continues on"), (started, "the held-out rows' version")):
        if not version_exists(url):
            raise SystemExit(f"cannot resume: {where}; {url} ({role}) is no longer a complete version in {root}")
    return started, reading


@dataclasses.dataclass
class TrainingData:
    """What the run reads: this rank's share of the version in use, as `(epoch, batch)` forever from
    `batches()`, the masking, and (rank 0) the held-out batches.

    Each pass over the loader continues from the dataset's position (mid-epoch after a resume) and a
    finished epoch moves on to the next. Held-out rows are dropped, so batches may be a little smaller
    than --batch-size. With --follow-latest an epoch boundary may move on to a newer version (the
    schedule stays as planned)."""

    config: TrainConfig
    ranks: Ranks
    started_on: str  # version URL: the held-out rows and the run's identity
    dataset: Any  # StreamingSequenceDataset of the version in use
    model_name: str
    tokenizer: Any
    masking: Any  # MaskingConfig at --mask-budget; `masking_at` gives a step's
    budget_schedule: Any  # BudgetSchedule
    eval_masking: Any
    eval_batches: list[dict[str, Any]]
    follower: Any  # LatestVersionFollower or None
    mask_in_workers: bool
    resume_rng: dict[str, Any] | None = None  # RNG state to restore once the loader has started
    sample_log: Any = None  # --sample-log, open for appending
    mixture: Any = None  # maskstream.trainer.mixture.Mixture with --mix
    loader: Any = None
    lease: Any = None  # rank 0's maskstream.storage.lease.VersionLease on the version read: gc spares it

    def __post_init__(self) -> None:
        self.loader = None if self.config.mix else self._make_loader()  # a mixture has a loader per source
        self.lease = VersionLease(self.dataset.version_url) if self.ranks.is_main else None
        if self.config.sample_log:
            self.sample_log = open(self.config.sample_log, "a", encoding="utf-8")  # noqa: SIM115 (closed by train)

    @property
    def source_names(self) -> list[str]:
        """What --sample-log and the metrics call each source: the domain's version, then --mix's."""
        return self.mixture.names if self.mixture is not None else [self.dataset.manifest.version]

    def log_samples(self, step: int, epoch: int, batch: dict[str, Any]) -> None:
        """--sample-log: one JSON line per sample of step `step` (1 = the first), written at once so
        that ranks appending to one file do not interleave within a batch. A mixture's rows carry
        their source's epoch."""
        if self.sample_log is None:
            return
        rank, count = self.ranks.rank, len(batch["sample_index"])
        sources = batch["source"].tolist() if "source" in batch else [0] * count
        epochs = batch["epoch"].tolist() if "epoch" in batch else [epoch] * count
        name = self.mixture.name_of if self.mixture is not None else lambda _s, _e: self.dataset.manifest.version
        self.sample_log.write("".join(
            json.dumps({"epoch": e, "source": name(s, e), "sample_index": i, "step": step, "rank": rank}) + "\n"
            for e, s, i in zip(epochs, sources, batch["sample_index"].tolist(), strict=True)))
        self.sample_log.flush()


    def masking_at(self, step: int, total_steps: int) -> Any:
        """The MaskingConfig of step `step` (0 = the first): the schedule's budget."""
        if self.budget_schedule.kind == "constant":
            return self.masking
        return dataclasses.replace(self.masking, budget=self.budget_schedule.at(step, total_steps))

    @property
    def pad_token_id(self) -> int:
        return self.dataset.manifest.tokenizer["pad_token_id"]

    def _make_loader(self):
        config = self.config
        return build_dataloader(self.dataset, batch_size=config.batch_size, num_workers=config.num_workers,
                                strategy=config.strategy, masking=self.masking, seed=config.seed,
                                mask_in_workers=self.mask_in_workers, pin_memory=self.ranks.device.type == "cuda")

    def _epoch_finished(self) -> bool:
        return self.dataset.state_dict()["samples_consumed"] >= self.dataset.rows_per_rank()

    def _follow(self) -> None:
        """At an epoch boundary, moves on to the version `latest` names if it is newer and compatible."""
        switch = poll_all_ranks(self.follower, self.ranks.world_size)
        if switch is not None:
            next_epoch = self.dataset.epoch + 1
            self.dataset = StreamingSequenceDataset(switch.version_url, seed=self.config.seed, rank=self.ranks.rank,
                                                    world_size=self.ranks.world_size, cache=shard_cache(self.config))
            if self.lease is not None:
                self.lease.move_to(switch.version_url)
            self.dataset.set_epoch(next_epoch)
            self.loader = self._make_loader()

    def _restore_rng(self) -> None:
        if self.resume_rng is not None:
            set_rng_state(self.resume_rng)
            self.resume_rng = None

    def batches(self) -> Iterator[tuple[int, dict[str, Any]]]:

        if self.mixture is not None:
            self._restore_rng()
            for batch in self.mixture:
                self.dataset = self.mixture.sources[0].dataset  # the domain's version in use (--follow-latest)
                # Held-out rows are the domain's: other sources are trained on whole.
                held = held_out(batch["sample_index"].numpy(), self.config.held_out_fraction) & (
                    batch["source"].numpy() == 0)
                if not held.all():
                    yield self.dataset.epoch, select_rows(batch, ~torch.from_numpy(held))
        while True:
            # Starting an iteration, the DataLoader draws its workers' base seed from the global generator.
            # A run resumed at an epoch's end restores the generators before that, as the run it continues
            # was there; one resumed mid-epoch after it, so that dropout continues exactly where it stopped.
            if self._epoch_finished():
                if self.follower is not None:
                    self._follow()
                self._restore_rng()
            for batch in self.loader:
                self._restore_rng()
                keep = ~torch.from_numpy(held_out(batch["sample_index"].numpy(), self.config.held_out_fraction))
                if keep.any():
                    yield self.dataset.epoch, select_rows(batch, keep)

    def loader_states(self) -> list[dict[str, Any]]:
        """Every rank's dataset state, so a resumed run (same world size) can restore each."""

        if self.mixture is not None:
            mixture = self.mixture.state_dict()
            state = {**mixture["sources"][0]["state"], "mixture": mixture}
        else:
            state = self.dataset.state_dict()
        if self.ranks.world_size == 1:
            return [state]
        states: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(states, state)
        return states


def open_data(config: TrainConfig, ranks: Ranks, saved: dict[str, Any] | None) -> TrainingData:
    """The dataset (the version --dataset names, or when resuming the one the checkpoint was reading),
    the tokenizer checked against it, the masking, the held-out batches and the follower."""

    url = config.dataset
    if saved is not None:
        started, url = resume_versions(config.dataset, config.follow_latest, saved)
    dataset = StreamingSequenceDataset(url, seed=config.seed, rank=ranks.rank, world_size=ranks.world_size,
                                       cache=shard_cache(config))
    if saved is None:
        started = dataset.version_url
    model_name = config.model or default_model()
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    manifest_vocab = dataset.manifest.tokenizer.get("vocab_size")
    if manifest_vocab is not None and manifest_vocab != len(tokenizer):
        raise SystemExit(f"{dataset.version_url} was tokenized with a vocabulary of {manifest_vocab} tokens, "
                         f"{model_name}'s tokenizer has {len(tokenizer)}: build the dataset with this model's tokenizer")
    # Same size is not the same vocabulary: token ids would silently mean other tokens.
    manifest_hash = dataset.manifest.tokenizer.get("vocab_hash")
    if manifest_hash is not None and manifest_hash != vocab_hash(tokenizer.get_vocab()):
        raise SystemExit(f"{dataset.version_url} was tokenized with another vocabulary (hash {manifest_hash[:12]}) "
                         f"than {model_name}'s tokenizer: build the dataset with this model's tokenizer")
    masking = MaskingConfig.from_manifest(dataset.manifest, budget=config.mask_budget, whole_word=config.whole_word)
    schedule = BudgetSchedule.parse(config.mask_budget_schedule, config.mask_budget)
    eval_masking = MaskingConfig.from_manifest(dataset.manifest)  # the defaults, whatever this run's settings
    # A resumed run's --dataset may name either version: their root is the first one's folder.
    root = started.rsplit("/", 1)[0] if saved is not None else dataset_root(config.dataset, dataset.version_url)
    follower = LatestVersionFollower(root, dataset.version_url, dataset.manifest) if config.follow_latest else None
    pad_token_id = dataset.manifest.tokenizer["pad_token_id"]
    eval_batches = collect_held_out(started, config.held_out_fraction, config.eval_samples, pad_token_id,
                                    config.batch_size) if ranks.is_main else []
    # A changing budget is drawn where the step is known: in this process, not in the loader workers;
    # a mixture's rows are masked by source once their batch is drawn.
    in_workers = masks_in_loader_workers(ranks.device) and schedule.kind == "constant" and not config.mix
    return TrainingData(config, ranks, started, dataset, model_name, tokenizer, masking, schedule, eval_masking,
                        eval_batches, follower, in_workers,
                        resume_rng=saved["rng"] if saved is not None else None)


def open_mixture(data: TrainingData, mask_map_of: Any) -> Any:
    """The --mix mixture around the domain's dataset, each source read by a loader of its own;
    `mask_map_of` gives the map a text source masked with difference needs."""
    config = data.config
    try:
        return build_mixture(data.dataset, config.mix, data.tokenizer, strategy=config.strategy, seed=config.seed,
                             batch_size=config.batch_size, num_workers=config.num_workers, cache=shard_cache(config),
                             follow=config.follow_latest, domain_follower=data.follower, lease=data.lease,
                             mask_map_of=mask_map_of, pin_memory=data.ranks.device.type == "cuda")
    except ValueError as e:  # a source that cannot be mixed: say which, in one line
        raise SystemExit(str(e)) from None


def plan_steps(config: TrainConfig, data: TrainingData, saved: dict[str, Any] | None) -> tuple[int, int]:
    """(total steps, warm-up steps): --max-steps, or --epochs of the version the run started on, or
    when resuming without --max-steps the checkpoint's."""
    if saved is not None and not config.max_steps:
        # A resumed run keeps the schedule it planned, whatever its world size and batch size now.
        return saved["config"]["total_steps"], saved["config"]["warmup_steps"]
    # Not resuming, the dataset is the version the run starts on.
    total_steps = config.max_steps or max(1, int(config.epochs * data.dataset.steps_per_epoch(config.batch_size)
                                                 / config.grad_accumulation))
    return total_steps, math.ceil(config.warmup_ratio * total_steps)


def run_settings(config: TrainConfig, data: TrainingData, total_steps: int, warmup_steps: int) -> dict[str, Any]:
    """What the checkpoints and summary.json record of the run (RESUME_CRITICAL among them)."""
    return {
        "dataset_version": data.started_on, "model": data.model_name, "objective": config.objective,
        "strategy": config.strategy, "mask_budget": config.mask_budget,
        "mask_budget_schedule": str(data.budget_schedule), "whole_word": config.whole_word,
        "batch_size": config.batch_size, "grad_accumulation": config.grad_accumulation, "total_steps": total_steps,
        "warmup_steps": warmup_steps, "learning_rate": config.learning_rate, "seed": config.seed,
        "world_size": data.ranks.world_size, "held_out_fraction": config.held_out_fraction,
        "eval_strategy": config.eval_strategy,
    }


@dataclasses.dataclass
class TrainingModel:
    mlm_model: Any  # the Hugging Face masked-LM: what model/ and checkpoints hold
    objective: Any  # the objective around it: what is trained, evaluated and checkpointed
    model: Any  # what the loop calls: the objective, wrapped for DDP and compiled if asked
    optimizer: Any
    scheduler: Any


def build_model(config: TrainConfig, data: TrainingData, total_steps: int, warmup_steps: int,
                run_config: dict[str, Any]) -> TrainingModel:
    """The model in its objective, AdamW (no weight decay on biases and norms) and the schedule.
    ExLM's expansion settings are recorded in `run_config`."""
    device = data.ranks.device
    mlm_model = load_mlm_model(data.model_name)
    options = {}
    if config.objective == "exlm":  # expansion settings (trainer/exlm.py), recorded with the run
        options = {"num_states": config.exlm_states, "token_budget": config.exlm_token_budget,
                   "mask_token_id": data.tokenizer.mask_token_id, "pad_token_id": data.pad_token_id}
        run_config.update(exlm_states=config.exlm_states, exlm_token_budget=config.exlm_token_budget)
    objective = OBJECTIVES[config.objective](mlm_model, **options).to(device)
    optimizer, scheduler = build_optimizer(objective, config.weight_decay, config.learning_rate, warmup_steps,
                                           total_steps, fused=device.type == "cuda")
    return TrainingModel(mlm_model, objective, objective, optimizer, scheduler)


def read_resume_state(config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint state to continue from (--resume), None when starting fresh."""
    if not config.resume:
        return None
    return read_training_state(Path(config.output) / "checkpoints" if config.resume == "latest" else config.resume)


def resume(saved: dict[str, Any], parts: TrainingModel, data: TrainingData, run_config: dict[str, Any]) -> int:
    """Restores weights, optimizer, schedule and loader position; returns the step to continue from."""
    was = {k: saved["config"].get(k, RESUME_DEFAULTS.get(k)) for k in RESUME_CRITICAL}
    changed = {k: (was[k], run_config[k]) for k in RESUME_CRITICAL if was[k] != run_config[k]}
    if changed:
        raise SystemExit(f"cannot resume {saved['path']} exactly: settings changed (was, now): {changed}")
    restore_checkpoint(saved, parts.objective, parts.optimizer, parts.scheduler)
    mixed = "mixture" in saved["loader"][0]
    if mixed != (data.mixture is not None):
        raise SystemExit(f"cannot resume {saved['path']}: it was {'' if mixed else 'not '}trained on a mixture; "
                         "resume with the same --mix")
    if data.mixture is not None:
        try:  # every rank's state: a mixture's ranks take their own rows from each source
            data.mixture.load_state_dict([state["mixture"] for state in saved["loader"]])
        except (ValueError, OSError) as e:  # other weights, a version gone: say which, in one line
            raise SystemExit(f"cannot resume {saved['path']}: {e}") from None
    else:
        data.dataset.load_state_dict(loader_state(saved, data.ranks.rank, data.ranks.world_size))
    log.info("resumed from %s at step %d", saved["path"], saved["step"])
    before = saved["loader"][0]
    if Layout(before["world_size"], before["num_workers"], before["batch_size"]).reading != Layout(
            data.ranks.world_size, data.config.num_workers, data.config.batch_size).reading:
        log.info("elastic resume: the checkpoint's %d rank(s) x %d worker(s) x batch %d continue as %d x %d x %d; "
                 "the %d samples left of epoch %d are dealt to the new layout", before["world_size"],
                 before["num_workers"], before["batch_size"], data.ranks.world_size, data.config.num_workers,
                 data.config.batch_size, data.dataset.rows_per_rank() * data.ranks.world_size, data.dataset.epoch)
    return saved["step"]


def loader_state(saved: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """The loader state rank `rank` of `world_size` continues from: its own when the world size is the
    checkpoint's, else any rank's (they agree on epoch and batches taken; elastic resume)."""
    states = saved["loader"]
    if len(states) == world_size:
        return states[rank]
    taken = {(s["epoch"], s["batches_consumed"], len(s.get("segments", []))) for s in states}
    if len(taken) != 1:
        raise SystemExit(f"cannot resume {saved['path']} on {world_size} ranks: its ranks disagree on the "
                         f"(epoch, batches, resumes) they had taken: {sorted(taken)}")
    return states[0]


def wrap_model(parts: TrainingModel, config: TrainConfig, ranks: Ranks) -> None:
    """DDP across ranks, torch.compile if asked: what the loop calls."""

    if ranks.world_size > 1:
        parts.model = torch.nn.parallel.DistributedDataParallel(
            parts.model, device_ids=[ranks.local_rank] if ranks.device.type == "cuda" else None)
    if config.compile:
        parts.model = torch.compile(parts.model)


def train_step(step: int, parts: TrainingModel, batches: Iterator[tuple[int, dict[str, Any]]], data: TrainingData,
               window: dict[str, Any], masking: Any) -> int:
    """One optimizer step over --grad-accumulation micro-batches masked with `masking` (unless the
    loader workers masked them), their sums added to `window`; returns the epoch of its last batch."""

    config, device = data.config, data.ranks.device
    for micro in range(config.grad_accumulation):
        wait_start = time.perf_counter()
        epoch, batch = next(batches)
        data.log_samples(step, epoch, batch)
        if data.mixture is not None:
            window["sources"] = [a + b for a, b in zip(window.get("sources", [0] * len(data.mixture.sources)),
                                                       data.mixture.counts(batch), strict=True)]
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        if data.mixture is not None:
            batch = mask_by_source(batch, data.mixture.strategies, masking, seed=config.seed)
        elif not data.mask_in_workers:
            batch = apply_masking(batch, config.strategy, masking, seed=config.seed, epoch=epoch)
        window["wait"] += time.perf_counter() - wait_start
        # DDP averages gradients across ranks on the last micro-batch of a step only.
        last_micro = micro == config.grad_accumulation - 1
        with parts.model.no_sync() if data.ranks.world_size > 1 and not last_micro else contextlib.nullcontext():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                out = parts.model(batch["input_ids"], batch["attention_mask"], batch["labels"])
            (out["loss"] / config.grad_accumulation).backward()
        window["loss"] += out["loss"].detach()
        window["correct"] += out["correct"]
        window["masked"] += out["masked"]
        window["tokens"] += batch["attention_mask"].sum()
        window["micro"] += 1
    torch.nn.utils.clip_grad_norm_(parts.model.parameters(), config.max_grad_norm)
    parts.optimizer.step()
    parts.scheduler.step()
    parts.optimizer.zero_grad(set_to_none=True)
    return epoch


def window_record(window: dict[str, Any], parts: TrainingModel, ranks: Ranks, epoch: int,
                  names: list[str]) -> dict[str, Any]:
    """The logged training metrics of one window (tokens, correct and masked summed over ranks; with a
    mixture, samples by source)."""

    elapsed = time.perf_counter() - window["start"]
    # One all-reduce: tokens, correct, masked, then (a mixture) the samples of each source.
    totals = torch.cat([torch.stack([torch.as_tensor(window[k], dtype=torch.float64, device=ranks.device)
                                     for k in ("tokens", "correct", "masked")]),
                        torch.tensor(window.get("sources", []), dtype=torch.float64, device=ranks.device)])
    if ranks.world_size > 1:
        dist.all_reduce(totals)
    (tokens, correct, masked), counts = totals[:3].tolist(), totals[3:].tolist()
    record = {"loss": float(window["loss"]) / window["micro"], "masked_accuracy": correct / max(masked, 1),
              "learning_rate": parts.scheduler.get_last_lr()[0], "tokens_per_second": tokens / elapsed,
              "data_wait_share": window["wait"] / elapsed, "epoch": epoch}
    if "sources" in window:  # a mixture: samples trained from each source, all ranks
        record["samples_by_source"] = dict(zip(names, (int(c) for c in counts), strict=True))
    return record


def evaluate_held_out(step: int, parts: TrainingModel, data: TrainingData, logger) -> dict[str, float]:
    held = evaluate(parts.objective, data.eval_batches, data.config.eval_strategy, data.eval_masking,
                    data.ranks.device)
    logger.log(step, "held_out", held)
    log.info("%s: held-out loss %.4f, perplexity %.2f, masked-token accuracy %.4f",
             f"step {step}" if step else "before training", held["loss"], held["perplexity"], held["accuracy"])
    return held


def evaluate_and_checkpoint(step: int, total_steps: int, parts: TrainingModel, data: TrainingData, logger,
                            run_config: dict[str, Any]) -> dict[str, float] | None:
    """Every --eval-every steps and at the end, the held-out metrics (rank 0; returned, else None);
    every --save-every steps and at the end, a checkpoint."""
    config, last = data.config, step == total_steps
    held = None
    if data.ranks.is_main and data.eval_batches and (step % config.eval_every == 0 or last):
        held = evaluate_held_out(step, parts, data, logger)
    if step % config.save_every == 0 or last:
        loader_states = data.loader_states()
        if data.ranks.is_main:
            save_checkpoint(Path(config.output) / "checkpoints", step, parts.objective, parts.optimizer,
                            parts.scheduler, loader_states, run_config)
    return held


def save_final(out: Path, step: int, parts: TrainingModel, data: TrainingData, run_config: dict[str, Any],
               held: dict[str, float]) -> None:
    """model/ (save_pretrained + tokenizer) and summary.json."""
    parts.mlm_model.save_pretrained(out / "model")
    data.tokenizer.save_pretrained(out / "model")
    summary = {"steps": step, "config": run_config, "held_out": held if data.eval_batches else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log.info("wrote %s (model/, checkpoints/, metrics.jsonl, tensorboard/, summary.json)", out)


def train(config: TrainConfig, mask_map_of: Any = None) -> int:
    """The training loop, top to bottom: set up the ranks, the data and the model (resuming from a
    checkpoint when asked), train, evaluate and checkpoint on schedule, save the final model.
    `mask_map_of(version_url)` gives a version's mask map (`maskstream.MaskMap.from_version`, which
    the trainer may not import): what a `--mix TEXT:WEIGHT:difference` source is masked with."""

    ranks = setup_ranks(config.seed)
    saved = read_resume_state(config)
    data = open_data(config, ranks, saved)
    if config.mix:
        data.mixture = open_mixture(data, mask_map_of)
    total_steps, warmup_steps = plan_steps(config, data, saved)
    run_config = run_settings(config, data, total_steps, warmup_steps)
    parts = build_model(config, data, total_steps, warmup_steps, run_config)
    step = resume(saved, parts, data, run_config) if saved is not None else 0
    wrap_model(parts, config, ranks)
    out = Path(config.output)
    logger = MetricsLogger(out, resume_step=step if saved is not None else None, enabled=ranks.is_main)
    if ranks.is_main:
        log.info("training %s on %s: %d steps (%d warm-up), strategy %s, %d rank(s) x batch %d x accumulation %d",
                 display_name(data.model_name), data.dataset.version_url, total_steps, warmup_steps, config.strategy,
                 ranks.world_size, config.batch_size, config.grad_accumulation)

    held: dict[str, float] = {}
    if ranks.is_main and data.eval_batches and saved is None:
        held = evaluate_held_out(0, parts, data, logger)
    batches = data.batches()
    parts.model.train()
    progress = tqdm(total=total_steps, initial=step, disable=not ranks.is_main, desc="train", unit="step")
    window = new_window()
    while step < total_steps:
        masking = data.masking_at(step, total_steps)
        epoch = train_step(step + 1, parts, batches, data, window, masking)
        step += 1
        progress.update(1)
        if step % config.log_every == 0 or step == total_steps:
            record = {**window_record(window, parts, ranks, epoch, data.source_names), "mask_budget": masking.budget}
            logger.log(step, "train", record)
            progress.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['learning_rate']:.2e}")
            window = new_window()
        paused = time.perf_counter()  # evaluation and checkpoints do not count in tokens/s
        held = evaluate_and_checkpoint(step, total_steps, parts, data, logger, run_config) or held
        window["start"] += time.perf_counter() - paused
    progress.close()

    if ranks.is_main:
        save_final(out, step, parts, data, run_config, held)
    logger.close()
    if data.sample_log is not None:
        data.sample_log.close()
    if data.mixture is not None:
        data.mixture.close()  # the leases of the domain and of the other sources
    elif data.lease is not None:
        data.lease.release()
    if ranks.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0

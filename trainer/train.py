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
from maskstream.trainer.optimizer import adamw, set_learning_rate
from maskstream.trainer.plan import Plan, Position, fresh_plan, learning_rate_factor, replan
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


    def masking_at(self, samples_done: int, plan: Plan) -> Any:
        """The MaskingConfig of the step that starts with `samples_done` trained: the schedule's budget,
        from the first step's (0 trained) to the last's (a full step before the planned samples)."""
        if self.budget_schedule.kind == "constant":
            return self.masking
        step_samples = self.config.batch_size * self.config.grad_accumulation * self.ranks.world_size
        return dataclasses.replace(self.masking, budget=self.budget_schedule.at(samples_done, plan.total_samples,
                                                                                 step_samples))

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

    def batches(self) -> Iterator[tuple[int, dict[str, Any], int]]:
        """(epoch, batch, rows dealt) without end: the rows dealt count the held-out rows dropped from
        the batch, and those of batches wholly held out, skipped before it (what the plan counts)."""

        if self.mixture is not None:
            self._restore_rng()
            dealt = 0
            for batch in self.mixture:
                self.dataset = self.mixture.sources[0].dataset  # the domain's version in use (--follow-latest)
                # Held-out rows are the domain's: other sources are trained on whole.
                held = held_out(batch["sample_index"].numpy(), self.config.held_out_fraction) & (
                    batch["source"].numpy() == 0)
                dealt += len(held)
                if not held.all():
                    yield self.dataset.epoch, select_rows(batch, ~torch.from_numpy(held)), dealt
                    dealt = 0
        dealt = 0
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
                dealt += len(keep)
                if keep.any():
                    yield self.dataset.epoch, select_rows(batch, keep), dealt
                    dealt = 0

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


def plan_run(config: TrainConfig, data: TrainingData, saved: dict[str, Any] | None, step: int,
             samples_done: int) -> Plan:
    """How long the run trains (maskstream.trainer.plan), from the loader's position. A fresh run plans
    --max-steps or --epochs; a resumed one keeps its checkpoint's plan on the same layout, works it out
    again on another world size or batch size (its epochs still end where they should), and with
    --max-steps given now trains to that step."""
    batch, world = config.batch_size, data.ranks.world_size
    if data.mixture is not None:  # full batches: the domain's epochs in batches, counted from the start
        steps_per_epoch = data.dataset.steps_per_epoch(batch)
        position = Position(0, steps_per_epoch * batch, steps_per_epoch, steps_per_epoch * batch, batch, world)
    else:
        position = Position.of(data.dataset, batch, world)
    accumulation = config.grad_accumulation
    if saved is None:
        return fresh_plan(position, epochs=config.epochs, max_steps=config.max_steps,
                          grad_accumulation=accumulation, warmup_ratio=config.warmup_ratio)
    was = saved["config"]
    before = saved["loader"][0]
    saved_plan = Plan(was["total_steps"], was["warmup_steps"], *saved_samples(saved, "total_samples", "warmup_samples"))
    if config.max_steps:  # to the step asked now
        saved_plan = dataclasses.replace(saved_plan, total_steps=config.max_steps)
    if (before["world_size"], before["batch_size"]) == (world, batch):
        if config.max_steps:
            return replan(saved_plan, step, samples_done, position, epochs=None, grad_accumulation=accumulation)
        return saved_plan  # the same batches: the plan as it was
    # A run planned in epochs (not --max-steps, not a mixture's) ends them on this layout.
    epochs = None if config.max_steps or data.mixture is not None else was.get("epochs")
    plan = replan(saved_plan, step, samples_done, position, epochs=epochs, grad_accumulation=accumulation)
    steps_before = saved_plan.total_steps - step
    if epochs is None:
        log.info("elastic resume: the %d step(s) left now cover %d samples, against %d on the checkpoint's layout",
                 steps_before, plan.total_samples - samples_done, saved_plan.total_samples - samples_done)
    else:
        log.info("elastic resume: %d step(s) (%d samples) finish the run's %g epoch(s) on this layout, where the "
                 "checkpoint's %d step(s) left would have covered %d samples", plan.total_steps - step, plan.total_samples - samples_done,
                 epochs, steps_before, position.samples_of(steps_before * accumulation))
    return plan


def saved_samples(saved: dict[str, Any], *keys: str) -> list[int]:
    """Sample counts a checkpoint's plan records; a checkpoint written before they were counted
    measured in steps: its steps times the rows of a full step of its layout."""
    was, before = saved["config"], saved["loader"][0]
    full_step = before["batch_size"] * before["world_size"] * was["grad_accumulation"]
    steps = {"total_samples": was["total_steps"], "warmup_samples": was["warmup_steps"], "samples": saved["step"]}
    progress = {**was, **saved.get("progress", {})}
    return [int(progress[k]) if k in progress else steps[k] * full_step for k in keys]


def run_settings(config: TrainConfig, data: TrainingData, saved: dict[str, Any] | None) -> dict[str, Any]:
    """What the checkpoints and summary.json record of the run (RESUME_CRITICAL among them; the plan's
    fields are added once it is made). `epochs` is what the run ends on, None for --max-steps (a
    resumed run's are its checkpoint's)."""
    epochs = None if config.max_steps else config.epochs
    if saved is not None and not config.max_steps:
        epochs = saved["config"].get("epochs")
    return {
        "dataset_version": data.started_on, "model": data.model_name, "objective": config.objective,
        "strategy": config.strategy, "mask_budget": config.mask_budget,
        "mask_budget_schedule": str(data.budget_schedule), "whole_word": config.whole_word,
        "batch_size": config.batch_size, "grad_accumulation": config.grad_accumulation, "epochs": epochs,
        "learning_rate": config.learning_rate, "seed": config.seed,
        "world_size": data.ranks.world_size, "held_out_fraction": config.held_out_fraction,
        "eval_strategy": config.eval_strategy,
    }


@dataclasses.dataclass
class TrainingModel:
    mlm_model: Any  # the Hugging Face masked-LM: what model/ and checkpoints hold
    objective: Any  # the objective around it: what is trained, evaluated and checkpointed
    model: Any  # what the loop calls: the objective, wrapped for DDP and compiled if asked
    optimizer: Any  # its learning rate set before each step from the samples trained (`plan`)


def build_model(config: TrainConfig, data: TrainingData, run_config: dict[str, Any]) -> TrainingModel:
    """The model in its objective and AdamW (no weight decay on biases and norms). ExLM's expansion
    settings are recorded in `run_config`."""
    device = data.ranks.device
    mlm_model = load_mlm_model(data.model_name)
    options = {}
    if config.objective == "exlm":  # expansion settings (trainer/exlm.py), recorded with the run
        options = {"num_states": config.exlm_states, "token_budget": config.exlm_token_budget,
                   "mask_token_id": data.tokenizer.mask_token_id, "pad_token_id": data.pad_token_id}
        run_config.update(exlm_states=config.exlm_states, exlm_token_budget=config.exlm_token_budget)
    objective = OBJECTIVES[config.objective](mlm_model, **options).to(device)
    optimizer = adamw(objective, config.weight_decay, config.learning_rate, fused=device.type == "cuda")
    return TrainingModel(mlm_model, objective, objective, optimizer)


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
    restore_checkpoint(saved, parts.objective, parts.optimizer)
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


def train_step(step: int, parts: TrainingModel, batches: Iterator[tuple[int, dict[str, Any], int]],
               data: TrainingData, window: dict[str, Any], masking: Any) -> tuple[int, int]:
    """One optimizer step over --grad-accumulation micro-batches masked with `masking` (unless the
    loader workers masked them), their sums added to `window`; returns the epoch of its last batch
    and the rows this rank was dealt for it."""

    config, device = data.config, data.ranks.device
    rows_dealt = 0
    for micro in range(config.grad_accumulation):
        wait_start = time.perf_counter()
        epoch, batch, dealt = next(batches)
        rows_dealt += dealt
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
    parts.optimizer.zero_grad(set_to_none=True)
    return epoch, rows_dealt


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
              "learning_rate": parts.optimizer.param_groups[0]["lr"], "tokens_per_second": tokens / elapsed,
              "data_wait_share": window["wait"] / elapsed, "epoch": epoch, "tokens": int(tokens)}
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
                            run_config: dict[str, Any], trained: dict[str, int]) -> dict[str, float] | None:
    """Every --eval-every steps and at the end, the held-out metrics (rank 0; returned, else None);
    every --save-every steps and at the end, a checkpoint (with the samples and tokens `trained`)."""
    config, last = data.config, step == total_steps
    held = None
    if data.ranks.is_main and data.eval_batches and (step % config.eval_every == 0 or last):
        held = evaluate_held_out(step, parts, data, logger)
    if step % config.save_every == 0 or last:
        loader_states = data.loader_states()
        if data.ranks.is_main:
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
    run_config = run_settings(config, data, saved)
    parts = build_model(config, data, run_config)
    step = resume(saved, parts, data, run_config) if saved is not None else 0
    # samples and tokens trained, all ranks: what the schedule follows and the records count
    trained = {"samples": 0, "tokens": 0}
    if saved is not None:
        trained = {"samples": saved_samples(saved, "samples")[0], "tokens": saved.get("progress", {}).get("tokens", 0)}
    plan = plan_run(config, data, saved, step, trained["samples"])
    run_config.update(plan.record())
    wrap_model(parts, config, ranks)
    out = Path(config.output)
    logger = MetricsLogger(out, resume_step=step if saved is not None else None, enabled=ranks.is_main)
    if ranks.is_main:
        log.info("training %s on %s: %d steps, %d samples (%d warm-up), strategy %s, %d rank(s) x batch %d x "
                 "accumulation %d", display_name(data.model_name), data.dataset.version_url, plan.total_steps,
                 plan.total_samples, plan.warmup_samples, config.strategy, ranks.world_size, config.batch_size,
                 config.grad_accumulation)

    held: dict[str, float] = {}
    if ranks.is_main and data.eval_batches and saved is None:
        held = evaluate_held_out(0, parts, data, logger)
    batches = data.batches()
    parts.model.train()
    progress = tqdm(total=plan.total_steps, initial=step, disable=not ranks.is_main, desc="train", unit="step")
    window = new_window()
    set_learning_rate(parts.optimizer, config.learning_rate * learning_rate_factor(trained["samples"], plan))
    while step < plan.total_steps:
        masking = data.masking_at(trained["samples"], plan)
        epoch, rows_dealt = train_step(step + 1, parts, batches, data, window, masking)
        step += 1
        trained["samples"] += rows_dealt * ranks.world_size  # every rank is dealt as many rows
        set_learning_rate(parts.optimizer, config.learning_rate * learning_rate_factor(trained["samples"], plan))
        progress.update(1)
        # A checkpoint's step is logged too, so that the tokens it records are all counted.
        if step % config.log_every == 0 or step % config.save_every == 0 or step == plan.total_steps:
            record = {**window_record(window, parts, ranks, epoch, data.source_names), "mask_budget": masking.budget}
            trained["tokens"] += record["tokens"]
            record.update(trained)
            logger.log(step, "train", record)
            progress.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['learning_rate']:.2e}")
            window = new_window()
        paused = time.perf_counter()  # evaluation and checkpoints do not count in tokens/s
        held = evaluate_and_checkpoint(step, plan.total_steps, parts, data, logger, run_config, trained) or held
        window["start"] += time.perf_counter() - paused
    progress.close()

    if ranks.is_main:
        save_final(out, step, parts, data, run_config, held, trained)
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

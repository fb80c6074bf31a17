"""Continued MLM pretraining on a maskstream dataset, streamed from disk or gs://.

Loads a masked-LM from a model name or path (a model without an MLM head, like the offline
MiniLM, gets a new head whose decoder is tied to the input embeddings; the log says which
weights are new), streams the dataset's shards, draws a fresh mask per epoch with any
strategy (`difference`, drawn from the dataset's stored mask probabilities, by default), and trains with
AdamW, linear warm-up then linear decay, gradient accumulation and clipping, bf16 autocast
on CUDA and optionally torch.compile. Several GPUs: launch with `torchrun`; each rank reads
its own share of the rows. On a GPU, masks are drawn on the device after the transfer; on
CPU, in the loader workers.

Held-out split: a row is held out (never trained on) when the top 24 bits of (its sample
index x 0x9E3779B97F4A7C15 mod 2^64), read as a number in [0, 1), fall below
--held-out-fraction: the same rows for every run, rank count and strategy. Evaluation masks the
first --eval-samples held-out rows in dataset order with --eval-strategy (`random` by default,
whatever the training strategy), the default budget (15%, 80/10/10) and a fixed seed, so loss,
perplexity and masked-token accuracy are comparable between runs and strategies.

Outputs in --output: checkpoints/ (every --save-every steps and at the end; `--resume`
continues from the newest exactly), metrics.jsonl and tensorboard/ (loss, masked-token
accuracy, learning rate, tokens/s, data-wait share; held-out loss, perplexity, accuracy),
summary.json, and model/ (save_pretrained + tokenizer: what `maskstream finetune` starts from).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from schemas import default_model
from schemas.manifest import vocab_hash
from schemas.models import display_name

log = logging.getLogger("maskstream.train")

STRATEGIES = ("random", "whole_word", "span", "difference")  # tmr is for fine-tuning
EVAL_SEED = 20_230_523  # fixed: every run masks the held-out rows the same way
HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: 2^64 / golden ratio


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset root or version folder (local or gs://)")
    parser.add_argument("--output", required=True, help="output folder (checkpoints, logs, final model)")
    parser.add_argument("--model", default=None, help="model name or path (default: the offline MiniLM)")
    parser.add_argument("--objective", default="mlm",
                        help="training objective, a name in trainer.objectives.OBJECTIVES (default: mlm)")
    parser.add_argument("--exlm-states", type=int, default=4,
                        help="with --objective exlm: [MASK] states per masked token, k (default: 4)")
    parser.add_argument("--exlm-token-budget", type=int, default=0,
                        help="with --objective exlm: most expanded tokens per forward pass; a larger batch runs "
                             "in checkpointed chunks, same loss and gradients (default: 0, no limit)")
    parser.add_argument("--strategy", default="difference", choices=STRATEGIES,
                        help="masking strategy; `difference` draws from the dataset's mask probabilities "
                             "(default: difference)")
    parser.add_argument("--whole-word", action="store_true",
                        help="with --strategy difference, mask whole words (default: off)")
    parser.add_argument("--mask-budget", type=float, default=0.15, help="share of tokens masked (default: 0.15)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per batch per device (default: 32)")
    parser.add_argument("--grad-accumulation", type=int, default=1,
                        help="batches per optimizer step (default: 1)")
    parser.add_argument("--epochs", type=float, default=1.0,
                        help="passes over the data when --max-steps is 0 (default: 1)")
    parser.add_argument("--max-steps", type=int, default=0,
                        help="optimizer steps to run; 0 derives them from --epochs (default: 0)")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="peak learning rate (default: 1e-4)")
    parser.add_argument("--weight-decay", type=float, default=0.01,
                        help="AdamW weight decay, not applied to biases and norms (default: 0.01)")
    parser.add_argument("--warmup-ratio", type=float, default=0.06,
                        help="warm-up steps as a share of all steps (default: 0.06)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (default: 1.0)")
    parser.add_argument("--seed", type=int, default=0, help="seed for shuffling, masks and initialization (default: 0)")
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes (default: 2)")
    parser.add_argument("--held-out-fraction", type=float, default=0.02,
                        help="share of rows held out for evaluation, never trained on (default: 0.02)")
    parser.add_argument("--eval-samples", type=int, default=512,
                        help="held-out rows evaluated, the first in dataset order (default: 512)")
    parser.add_argument("--eval-strategy", default="random", choices=STRATEGIES,
                        help="masking of the held-out rows, same for every run (default: random)")
    parser.add_argument("--eval-every", type=int, default=500, help="evaluate every N steps and at the end (default: 500)")
    parser.add_argument("--log-every", type=int, default=10, help="log training metrics every N steps (default: 10)")
    parser.add_argument("--save-every", type=int, default=1000,
                        help="write a checkpoint every N steps and at the end (default: 1000)")
    parser.add_argument("--resume", nargs="?", const="latest", default=None,
                        help="continue from a checkpoint folder, or with no value from the newest in "
                             "OUTPUT/checkpoints (default: start fresh)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (default: off)")
    parser.add_argument("--follow-latest", action="store_true",
                        help="at each epoch boundary move on to the newest complete version of the dataset root "
                             "(--dataset, or the root holding the version it names) when its tokenizer matches; "
                             "logs the switch and the seeds that changed (default: off)")


# --- held-out split -------------------------------------------------------------------------


def check_ranges(*checks: tuple[str, Any, bool]) -> None:
    """Exits with a message naming the first (option, value, in_range) check that fails."""
    for name, value, ok in checks:
        if not ok:
            raise SystemExit(f"{name} {value} is out of range (see --help)")


def held_out(sample_index: np.ndarray, fraction: float) -> np.ndarray:
    """True for held-out rows: the top 24 bits of (sample_index * 0x9E3779B97F4A7C15 mod 2^64), read as
    a number in [0, 1), are below `fraction`. Depends on the row's global index only."""
    hashed = np.asarray(sample_index, dtype=np.uint64) * HASH_MULTIPLIER
    return (hashed >> np.uint64(40)).astype(np.float64) / float(1 << 24) < fraction


def select_rows(batch: dict[str, Any], keep) -> dict[str, Any]:
    return {k: v[keep] for k, v in batch.items()}


def new_window() -> dict[str, Any]:
    """Fresh training-metric sums for one logging window, timed from now."""
    return {"loss": 0.0, "correct": 0, "masked": 0, "tokens": 0, "micro": 0, "wait": 0.0,
            "start": time.perf_counter()}


def build_optimizer(module, weight_decay: float, lr: float, warmup_steps: int, total_steps: int,
                    fused: bool | None = None):
    """AdamW over `module`'s parameters (no weight decay on biases and norms) and a linear warm-up then
    linear decay schedule; returns (optimizer, scheduler). `fused` is passed to AdamW as given."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    no_decay = ("bias", "LayerNorm.weight", "layernorm.weight", "norm.weight")
    groups = [
        {"params": [p for n, p in module.named_parameters() if not n.endswith(no_decay)],
         "weight_decay": weight_decay},
        {"params": [p for n, p in module.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, fused=fused)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)
    return optimizer, scheduler


def collect_held_out(dataset_url: str, fraction: float, limit: int, pad_token_id: int, batch_size: int):
    """The first `limit` held-out rows in dataset order, collated into batches (unmasked)."""
    from trainer.collate import collate_sequences
    from trainer.dataset import StreamingSequenceDataset

    reader = StreamingSequenceDataset(dataset_url, shuffle=False, rank=0, world_size=1)
    rows = []
    for sample in reader:
        if held_out(np.array([sample["sample_index"]]), fraction)[0]:
            rows.append(sample)
            if len(rows) >= limit:
                break
    return [collate_sequences(rows[i:i + batch_size], pad_token_id=pad_token_id)
            for i in range(0, len(rows), batch_size)]


def evaluate(objective, eval_batches, strategy: str, masking, device) -> dict[str, float]:
    """Loss (mean over all masked tokens), perplexity = exp(loss) and masked-token accuracy on the
    held-out batches, masked with the fixed EVAL_SEED."""
    import torch

    from trainer.masking import apply_masking

    was_training = objective.training
    objective.eval()
    total_nll, correct, masked = 0.0, 0, 0
    with torch.no_grad():
        for batch in eval_batches:
            batch = apply_masking({k: v.to(device) for k, v in batch.items()}, strategy, masking,
                                  seed=EVAL_SEED, epoch=0)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                out = objective(batch["input_ids"], batch["attention_mask"], batch["labels"])
            total_nll += float(out["nll"])
            correct += int(out["correct"])
            masked += int(out["masked"])
    objective.train(was_training)
    loss = total_nll / max(masked, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "accuracy": correct / max(masked, 1),
            "masked_tokens": masked}


# --- the run ---------------------------------------------------------------------------------


def masks_in_loader_workers(device) -> bool:
    """On CPU the loader workers draw the masks; on a GPU the device does, after the transfer."""
    return device.type == "cpu"


RESUME_CRITICAL = ("dataset_version", "model", "objective", "strategy", "mask_budget", "whole_word", "batch_size",
                   "grad_accumulation", "total_steps", "seed", "world_size", "held_out_fraction")


def run(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from trainer.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
    from trainer.dataset import StreamingSequenceDataset
    from trainer.follow import LatestVersionFollower, dataset_root, poll_all_ranks
    from trainer.loader import build_dataloader
    from trainer.masking import MaskingConfig, apply_masking
    from trainer.metrics import MetricsLogger
    from trainer.objectives import OBJECTIVES, load_mlm_model

    check_ranges(("--batch-size", args.batch_size, args.batch_size >= 1),
                 ("--grad-accumulation", args.grad_accumulation, args.grad_accumulation >= 1),
                 ("--held-out-fraction", args.held_out_fraction, 0 <= args.held_out_fraction < 1),
                 ("--warmup-ratio", args.warmup_ratio, 0 <= args.warmup_ratio <= 1),
                 ("--max-steps", args.max_steps, args.max_steps >= 0),
                 ("--log-every", args.log_every, args.log_every >= 1),
                 ("--eval-every", args.eval_every, args.eval_every >= 1),
                 ("--save-every", args.save_every, args.save_every >= 1),
                 ("--exlm-states", args.exlm_states, args.exlm_states >= 1),
                 ("--exlm-token-budget", args.exlm_token_budget, args.exlm_token_budget >= 0))

    # Distributed set-up: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE.
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
    is_main = rank == 0
    out = Path(args.output)
    checkpoints = out / "checkpoints"
    torch.manual_seed(args.seed)

    # Data: this rank's share of the rows, masked in the workers on CPU, on the device on GPU.
    dataset = StreamingSequenceDataset(args.dataset, seed=args.seed, rank=rank, world_size=world_size)
    model_name = args.model or default_model()
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
    strategy = args.strategy
    masking = MaskingConfig.from_manifest(dataset.manifest, budget=args.mask_budget, whole_word=args.whole_word)
    eval_masking = MaskingConfig.from_manifest(dataset.manifest)  # the defaults, whatever this run's settings
    mask_in_workers = masks_in_loader_workers(device)

    def make_loader(dataset):
        return build_dataloader(dataset, batch_size=args.batch_size, num_workers=args.num_workers,
                                strategy=strategy, masking=masking, seed=args.seed, mask_in_workers=mask_in_workers,
                                pin_memory=device.type == "cuda")

    loader = make_loader(dataset)
    follower = LatestVersionFollower(dataset_root(args.dataset, dataset.version_url), dataset.version_url,
                                     dataset.manifest) if args.follow_latest else None
    pad_token_id = dataset.manifest.tokenizer["pad_token_id"]
    eval_batches = collect_held_out(dataset.version_url, args.held_out_fraction, args.eval_samples, pad_token_id,
                                    args.batch_size) if is_main else []

    total_steps = args.max_steps or max(1, int(args.epochs * dataset.steps_per_epoch(args.batch_size)
                                               / args.grad_accumulation))
    warmup_steps = math.ceil(args.warmup_ratio * total_steps)
    run_config = {
        "dataset_version": dataset.version_url, "model": model_name, "objective": args.objective,
        "strategy": strategy, "mask_budget": args.mask_budget, "whole_word": args.whole_word, "batch_size": args.batch_size,
        "grad_accumulation": args.grad_accumulation, "total_steps": total_steps, "warmup_steps": warmup_steps,
        "learning_rate": args.learning_rate, "seed": args.seed, "world_size": world_size,
        "held_out_fraction": args.held_out_fraction, "eval_strategy": args.eval_strategy,
    }

    # Model in its objective, optimizer (no weight decay on biases and norms), schedule.
    if args.objective not in OBJECTIVES:
        raise SystemExit(f"unknown --objective {args.objective!r}; choose one of {sorted(OBJECTIVES)}")
    mlm_model = load_mlm_model(model_name)
    options = {}
    if args.objective == "exlm":  # expansion settings (trainer/exlm.py), recorded with the run
        options = {"num_states": args.exlm_states, "token_budget": args.exlm_token_budget,
                   "mask_token_id": tokenizer.mask_token_id, "pad_token_id": pad_token_id}
        run_config.update(exlm_states=args.exlm_states, exlm_token_budget=args.exlm_token_budget)
    objective = OBJECTIVES[args.objective](mlm_model, **options).to(device)
    optimizer, scheduler = build_optimizer(objective, args.weight_decay, args.learning_rate, warmup_steps, total_steps,
                                           fused=device.type == "cuda")

    step, epoch, resume_rng = 0, 0, None
    if args.resume:
        state = load_checkpoint(checkpoints if args.resume == "latest" else args.resume, objective, optimizer,
                                scheduler, restore_rng=False)
        resume_rng = state["rng"]
        changed = {k: (state["config"].get(k), run_config[k]) for k in RESUME_CRITICAL
                   if state["config"].get(k) != run_config[k]}
        if changed:
            raise SystemExit(f"cannot resume {state['path']} exactly: settings changed (was, now): {changed}")
        step = state["step"]
        dataset.load_state_dict(state["loader"][rank])
        log.info("resumed from %s at step %d", state["path"], step)
    model = objective  # what the loop calls: the objective, wrapped for DDP and compiled if asked
    if world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda"
                                                          else None)
    if args.compile:
        model = torch.compile(model)
    logger = MetricsLogger(out, resume_step=step if args.resume else None, enabled=is_main)
    if is_main:
        log.info("training %s on %s: %d steps (%d warm-up), strategy %s, %d rank(s) x batch %d x accumulation %d",
                 display_name(model_name), dataset.version_url, total_steps, warmup_steps, strategy, world_size,
                 args.batch_size, args.grad_accumulation)

    def batch_stream():
        """(epoch, batch) forever. Each pass over the loader continues from the dataset's position
        (mid-epoch after a resume) and a finished epoch moves on to the next. Held-out rows are
        dropped here, so batches may be a little smaller than --batch-size. With --follow-latest,
        an epoch boundary may move on to a newer dataset version (the schedule stays as planned)."""
        nonlocal dataset, loader
        while True:
            for batch in loader:
                keep = ~torch.from_numpy(held_out(batch["sample_index"].numpy(), args.held_out_fraction))
                if keep.any():
                    yield dataset.epoch, select_rows(batch, keep)
            switch = poll_all_ranks(follower, world_size) if follower is not None else None
            if switch is not None:
                next_epoch = dataset.epoch + 1
                dataset = StreamingSequenceDataset(switch.version_url, seed=args.seed, rank=rank, world_size=world_size)
                dataset.set_epoch(next_epoch)
                loader = make_loader(dataset)

    def gather_loader_state() -> list[dict]:
        """Every rank's dataset state, so a resumed run (same world size) can restore each."""
        state = dataset.state_dict()
        if world_size == 1:
            return [state]
        states: list[Any] = [None] * world_size
        dist.all_gather_object(states, state)
        return states

    # The training loop.
    batches = batch_stream()
    held: dict[str, float] = {}
    if is_main and eval_batches and not args.resume:
        held = evaluate(objective, eval_batches, args.eval_strategy, eval_masking, device)
        logger.log(0, "held_out", held)
        log.info("before training: held-out loss %.4f, perplexity %.2f, masked-token accuracy %.4f",
                 held["loss"], held["perplexity"], held["accuracy"])
    model.train()
    progress = tqdm(total=total_steps, initial=step, disable=not is_main, desc="train", unit="step")
    window = new_window()
    while step < total_steps:
        for micro in range(args.grad_accumulation):
            wait_start = time.perf_counter()
            epoch, batch = next(batches)
            if resume_rng is not None:
                # Starting an iteration, the DataLoader draws its workers' base seed from the global
                # generator; restoring after that makes dropout continue exactly where it stopped.
                set_rng_state(resume_rng)
                resume_rng = None
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            if not mask_in_workers:
                batch = apply_masking(batch, strategy, masking, seed=args.seed, epoch=epoch)
            window["wait"] += time.perf_counter() - wait_start
            # DDP averages gradients across ranks on the last micro-batch of a step only.
            last_micro = micro == args.grad_accumulation - 1
            with model.no_sync() if world_size > 1 and not last_micro else contextlib.nullcontext():
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    out_step = model(batch["input_ids"], batch["attention_mask"], batch["labels"])
                (out_step["loss"] / args.grad_accumulation).backward()
            window["loss"] += out_step["loss"].detach()
            window["correct"] += out_step["correct"]
            window["masked"] += out_step["masked"]
            window["tokens"] += batch["attention_mask"].sum()
            window["micro"] += 1
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        progress.update(1)

        if step % args.log_every == 0 or step == total_steps:
            elapsed = time.perf_counter() - window["start"]
            totals = torch.stack([torch.as_tensor(window[k], dtype=torch.float64, device=device)
                                  for k in ("tokens", "correct", "masked")])
            if world_size > 1:
                dist.all_reduce(totals)
            tokens, correct, masked = totals.tolist()
            record = {"loss": float(window["loss"]) / window["micro"], "masked_accuracy": correct / max(masked, 1),
                      "learning_rate": scheduler.get_last_lr()[0], "tokens_per_second": tokens / elapsed,
                      "data_wait_share": window["wait"] / elapsed, "epoch": epoch}
            logger.log(step, "train", record)
            progress.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['learning_rate']:.2e}")
            window = new_window()
        paused = time.perf_counter()  # evaluation and checkpoints do not count in tokens/s
        if is_main and eval_batches and (step % args.eval_every == 0 or step == total_steps):
            held = evaluate(objective, eval_batches, args.eval_strategy, eval_masking, device)
            logger.log(step, "held_out", held)
            log.info("step %d: held-out loss %.4f, perplexity %.2f, masked-token accuracy %.4f", step,
                     held["loss"], held["perplexity"], held["accuracy"])
        if step % args.save_every == 0 or step == total_steps:
            loader_states = gather_loader_state()
            if is_main:
                save_checkpoint(checkpoints, step, objective, optimizer, scheduler, loader_states, run_config)
        window["start"] += time.perf_counter() - paused
    progress.close()

    if is_main:
        mlm_model.save_pretrained(out / "model")
        tokenizer.save_pretrained(out / "model")
        summary = {"steps": step, "config": run_config, "held_out": held if eval_batches else None}
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        log.info("wrote %s (model/, checkpoints/, metrics.jsonl, tensorboard/, summary.json)", out)
    logger.close()
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0

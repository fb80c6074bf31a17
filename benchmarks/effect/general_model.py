"""The general model every arm starts from: BERT-shaped, MiniLM's WordPiece vocabulary, pretrained here
from scratch with random masking (BERT's 15%, 80/10/10) on general text outside the task's domain.

It lives in MODELS/KEY (by default `benchmarks/effect/models/KEY`, committed): fp16 safetensors, the
tokenizer's files and `general.json`, the record of its training inputs, settings, held-out curve, wall
time and hardware. KEY is made from its training inputs and settings (the texts' sha256, the shape, the
steps, the tokenizer's package and version); the weights' sha256 is recorded beside it and enters every
result's identity. A clone that has MODELS/KEY uses it; one that does not trains it.

Training is resumable: every `checkpoint_every` steps the weights, optimizer, schedule, curve and elapsed
time go to MODELS/KEY.checkpoint/state.pt, and a new run continues from it. A training longer than a session
commits its newest checkpoint at the session's stop, so a fresh clone continues too; the finished model's
commit removes it. The data order and the masks are pure functions of (seed, step): pass p reads the rows
in `default_rng([seed, p]).permutation`, and step s draws its masks and dropout after
`torch.manual_seed(seed * 1_000_003 + s)`, so a resumed run trains on exactly what an uncut one would.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from maskstream.schemas.manifest import sha256_file

MODELS = Path(__file__).resolve().parent / "models"
EVAL_SEED = 1234  # the held-out masks: the same for every evaluation
WEIGHTS = "model.safetensors"


def general_key(texts_sha256: str, shape: dict[str, Any], settings: dict[str, Any], max_length: int,
                tokenizer: dict[str, str]) -> str:
    key = {"texts": texts_sha256, "shape": shape, "settings": settings, "max_length": max_length,
           "tokenizer": tokenizer}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def packed_windows(texts: list[str], tokenizer, max_length: int) -> np.ndarray:
    """Every text's tokens followed by [SEP], concatenated and cut into rows of [CLS] + max_length - 1
    tokens (the last, short row dropped): every token is trained on, and no row is padding."""
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]:
        stream += ids + [tokenizer.sep_token_id]
    width = max_length - 1
    rows = len(stream) // width
    body = np.asarray(stream[: rows * width], dtype=np.int64).reshape(rows, width)
    return np.concatenate([np.full((rows, 1), tokenizer.cls_token_id, dtype=np.int64), body], axis=1)


def held_out_rows(rows: int, fraction: float) -> np.ndarray:
    """Which rows are held out: a hash of the row index, so the choice does not depend on the order."""
    return np.array([int(hashlib.sha256(f"held-out:{i}".encode()).hexdigest()[:8], 16) / 2**32 < fraction
                     for i in range(rows)], dtype=bool)


def masked_accuracy(objective, collator, rows: np.ndarray, batch_size: int, device: str) -> dict[str, float]:
    """Masked-token accuracy and loss on `rows`, masks drawn from EVAL_SEED (the same every time)."""
    import torch

    state = torch.get_rng_state()
    torch.manual_seed(EVAL_SEED)
    nll, correct, masked = 0.0, 0, 0
    objective.eval()
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = collator([{"input_ids": r} for r in rows[start:start + batch_size].tolist()])
            out = objective(batch["input_ids"].to(device), torch.ones_like(batch["input_ids"]).to(device),
                            batch["labels"].to(device))
            nll, correct, masked = nll + float(out["nll"]), correct + int(out["correct"]), masked + int(out["masked"])
    objective.train()
    torch.set_rng_state(state)
    return {"accuracy": correct / max(masked, 1), "loss": nll / max(masked, 1), "masked_tokens": masked}


def hardware(device: str) -> dict[str, Any]:
    """CPU, cores, torch threads and, on CUDA, the GPU: recorded with the model and every result line."""
    import torch

    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None}


class Schedule:
    """Linear warm-up to the learning rate, then linear decay to 0 at the last step."""

    def __init__(self, steps: int, warmup: int) -> None:
        self.steps, self.warmup = steps, warmup

    def __call__(self, step: int) -> float:
        return min((step + 1) / self.warmup, max(0.0, (self.steps - step) / max(self.steps - self.warmup, 1)))


def compact_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """AdamW's moments in bfloat16 for a checkpoint that is committed: half their bytes, and the resumed
    run's moments differ from an uncut run's by bf16 rounding only (the weights stay float32)."""
    import torch

    return {**state, "state": {k: {name: v.to(torch.bfloat16) if v.is_floating_point() and v.dim() else v
                                   for name, v in moments.items()} for k, moments in state["state"].items()}}


def train_general_model(texts: list[str], tokenizer_name: str, shape: dict[str, Any], settings: dict[str, Any],
                        max_length: int, out: Path, device: str, checkpoint: Path | None = None,
                        stop_after: float | None = None) -> dict[str, Any] | None:
    """Pretrains the model from scratch (or from its checkpoint) and saves it in `out`; its record.

    checkpoint: the state file (default `out`.checkpoint/state.pt). stop_after: seconds of this call after
    which training stops at the next checkpoint and returns None, its state saved for the next call."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling

    from maskstream.trainer.objectives import MaskedLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    rows = packed_windows(texts, tokenizer, max_length)
    held = held_out_rows(len(rows), settings["held_out_fraction"])
    train_rows, eval_rows = rows[~held], rows[held]
    steps, batch_size, seed = settings["steps"], settings["batch_size"], settings["seed"]
    per_pass = len(train_rows) // batch_size
    if per_pass == 0 or len(eval_rows) == 0:
        raise SystemExit(f"the general corpus makes {len(rows)} rows of {max_length} tokens: too few to train "
                         f"batches of {batch_size} and hold out (use more text or a shorter max_length)")
    torch.manual_seed(seed)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=max_length, **shape))
    objective = MaskedLM(model).to(device)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, return_tensors="pt")
    optimizer = torch.optim.AdamW(objective.parameters(), lr=settings["learning_rate"], weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, Schedule(steps, settings.get("warmup_steps",
                                                                                       max(1, steps // 16))))
    every = settings.get("checkpoint_every", 0)
    checkpoint = checkpoint or out.with_name(out.name + ".checkpoint") / "state.pt"
    call_started = time.perf_counter()
    state = {"step": 0, "losses": [], "evaluations": [], "seconds": 0.0}
    if every and checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        objective.load_state_dict(saved["objective"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        state = saved["state"]
        print(f"general model: resumed at step {state['step']}/{steps} from {checkpoint.parent.name}", flush=True)
    else:
        state["evaluations"].append({"step": 0, **masked_accuracy(objective, collator, eval_rows, batch_size, device)})
    started, permutation, permutation_pass = time.perf_counter() - state["seconds"], None, -1
    while state["step"] < steps:
        step = state["step"]
        epoch, position = divmod(step, per_pass)
        if epoch != permutation_pass:
            permutation, permutation_pass = np.random.default_rng([seed, epoch]).permutation(len(train_rows)), epoch
        torch.manual_seed(seed * 1_000_003 + step)  # this step's masks and dropout
        chosen = train_rows[permutation[position * batch_size:(position + 1) * batch_size]]
        batch = collator([{"input_ids": r} for r in chosen.tolist()])
        loss = objective(batch["input_ids"].to(device), torch.ones_like(batch["input_ids"]).to(device),
                         batch["labels"].to(device))["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] = step + 1
        state["losses"].append(round(loss.item(), 4))
        if state["step"] % max(steps // 20, 1) == 0:
            print(f"general model step {state['step']}/{steps}: loss {np.mean(state['losses'][-50:]):.3f} "
                  f"({(time.perf_counter() - started) / max(state['step'], 1):.2f} s/step overall)", flush=True)
        if every and (state["step"] % every == 0 or state["step"] == steps):
            evaluation = masked_accuracy(objective, collator, eval_rows, batch_size, device)
            state["evaluations"].append({"step": state["step"], **evaluation})
            state["seconds"] = time.perf_counter() - started
            print(f"general model step {state['step']}: held-out masked-token accuracy {evaluation['accuracy']:.4f}, "
                  f"loss {evaluation['loss']:.3f}", flush=True)
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"objective": objective.state_dict(),
                        "optimizer": compact_optimizer_state(optimizer.state_dict()),
                        "scheduler": scheduler.state_dict(), "state": state}, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)
            if stop_after is not None and time.perf_counter() - call_started > stop_after and state["step"] < steps:
                print(f"general model: stopped at step {state['step']}/{steps}, state in {checkpoint}", flush=True)
                return None
    after = state["evaluations"][-1] if state["evaluations"][-1]["step"] == steps else {
        "step": steps, **masked_accuracy(objective, collator, eval_rows, batch_size, device)}
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.half().save_pretrained(tmp)  # fp16: half the bytes in git; loaded back as fp32 (`fp32_copy`)
    tokenizer.save_pretrained(tmp)
    losses = state["losses"]
    record = {"rows": {"train": int(len(train_rows)), "held_out": int(len(eval_rows))}, "max_length": max_length,
              "tokens": {"train": int(train_rows.size), "held_out": int(eval_rows.size)},
              "shape": shape, "settings": settings, "parameters": sum(p.numel() for p in model.parameters()),
              "passes": steps * batch_size / len(train_rows), "held_out_before": state["evaluations"][0],
              "held_out": {k: after[k] for k in ("accuracy", "loss", "masked_tokens")},
              "held_out_curve": state["evaluations"],
              "loss_first50": float(np.mean(losses[:50])), "loss_last50": float(np.mean(losses[-50:])),
              "seconds": time.perf_counter() - started, "hardware": hardware(device),
              "weights_sha256": sha256_file(str(tmp / WEIGHTS)), "weights_bytes": (tmp / WEIGHTS).stat().st_size}
    (tmp / "general.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    shutil.rmtree(checkpoint.parent, ignore_errors=True)
    return record


def ensure_general_model(texts: list[str], texts_sha256: str, tokenizer_name: str, tokenizer: dict[str, str],
                         config: dict[str, Any], device: str, models: Path = MODELS) -> tuple[Path, dict[str, Any]]:
    """(model folder, record): MODELS/KEY for these inputs and settings, trained when missing."""
    key = general_key(texts_sha256, config["model"], config["general"], config["max_length"], tokenizer)
    out = models / key
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process training the same model: wait for it, then reuse
        if (out / "general.json").exists():
            record = json.loads((out / "general.json").read_text(encoding="utf-8"))
            print(f"general model {key}: found (held-out masked-token accuracy {record['held_out']['accuracy']:.4f})")
        else:
            print(f"general model {key}: training ({config['general']['steps']} steps)", flush=True)
            record = train_general_model(texts, tokenizer_name, config["model"], config["general"],
                                         config["max_length"], out, device)
    if sha256_file(str(out / WEIGHTS)) != record["weights_sha256"]:
        raise SystemExit(f"general model {key}: {WEIGHTS} does not match the sha256 in its general.json")
    if math.isnan(record["held_out"]["loss"]):
        raise SystemExit(f"general model {key}: held-out loss is nan")
    return out, {"key": key, **record}


def fp32_copy(model: Path, work: Path) -> Path:
    """The committed fp16 model as an fp32 folder in `work` (what TAPT and the probe load), made once."""
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM

    record = json.loads((model / "general.json").read_text(encoding="utf-8"))
    out = work / f"general-fp32-{record['weights_sha256'][:16]}"
    if (out / "general.json").exists():
        return out
    # A folder of its own per process: two pilot processes may make the copy at once; the first rename wins.
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=".tmp", dir=work))
    BertForMaskedLM.from_pretrained(model, dtype=torch.float32).save_pretrained(tmp)
    AutoTokenizer.from_pretrained(model).save_pretrained(tmp)
    shutil.copy(model / "general.json", tmp / "general.json")
    try:
        tmp.rename(out)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out

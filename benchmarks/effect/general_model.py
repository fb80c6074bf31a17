"""The general model every arm starts from: BERT-shaped, MiniLM's WordPiece vocabulary, pretrained here
from scratch with random masking (BERT's 15%, 80/10/10) on general text outside the task's domain.

It is cached outside the repository under a key made from its training inputs and settings (the
texts' sha256, the shape, the steps, the tokenizer's package and version), not from its weights:
results stay grouped when it is retrained on another machine, and it is rebuilt when missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.dataset.tokenizer_facts import cache_root  # the user cache, shared with the tokenizer facts

EVAL_SEED = 1234  # the held-out masks: the same for every evaluation


def general_key(texts_sha256: str, shape: dict[str, Any], settings: dict[str, Any], max_length: int,
                tokenizer: dict[str, str]) -> str:
    key = {"texts": texts_sha256, "shape": shape, "settings": settings, "max_length": max_length,
           "tokenizer": tokenizer}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def packed_windows(texts: list[str], tokenizer, max_length: int) -> np.ndarray:
    """Every text's tokens followed by [SEP], concatenated and cut into rows of [CLS] + max_length - 1
    tokens (the last, short row dropped): every token is trained on, and no row is padding."""
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
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


def train_general_model(texts: list[str], tokenizer_name: str, shape: dict[str, Any], settings: dict[str, Any],
                        max_length: int, out: Path, device: str) -> dict[str, Any]:
    """Pretrains the model from scratch and saves it (model + tokenizer) in `out`; returns its record."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling

    from trainer.objectives import MaskedLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    rows = packed_windows(texts, tokenizer, max_length)
    held = held_out_rows(len(rows), settings["held_out_fraction"])
    train_rows, eval_rows = rows[~held], rows[held]
    if len(train_rows) == 0 or len(eval_rows) == 0:
        raise SystemExit(f"the general corpus makes {len(rows)} rows of {max_length} tokens: too few to train "
                         "and hold out (use more text or a shorter max_length)")
    torch.manual_seed(settings["seed"])
    model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=max_length, **shape))
    objective = MaskedLM(model).to(device)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, return_tensors="pt")
    steps, batch_size = settings["steps"], settings["batch_size"]
    optimizer = torch.optim.AdamW(objective.parameters(), lr=settings["learning_rate"], weight_decay=0.01)
    warmup = max(1, steps // 16)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(steps - warmup, 1))))
    order = np.random.default_rng(settings["seed"])
    before = masked_accuracy(objective, collator, eval_rows, batch_size, device)
    curve, started, step = [], time.perf_counter(), 0
    while step < steps:  # one pass per iteration, each in a new order
        permutation = order.permutation(len(train_rows))
        for start in range(0, max(len(train_rows) - batch_size + 1, 1), batch_size):
            batch = collator([{"input_ids": r} for r in train_rows[permutation[start:start + batch_size]].tolist()])
            loss = objective(batch["input_ids"].to(device), torch.ones_like(batch["input_ids"]).to(device),
                             batch["labels"].to(device))["loss"]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            curve.append(loss.item())
            if step % max(steps // 10, 1) == 0:
                print(f"general model step {step}/{steps}: loss {np.mean(curve[-10:]):.3f}", flush=True)
            if step >= steps:
                break
    after = masked_accuracy(objective, collator, eval_rows, batch_size, device)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    record = {"rows": {"train": int(len(train_rows)), "held_out": int(len(eval_rows))}, "max_length": max_length,
              "shape": shape, "settings": settings, "parameters": sum(p.numel() for p in model.parameters()),
              "passes": steps * batch_size / len(train_rows), "held_out_before": before, "held_out": after,
              "loss_first10": float(np.mean(curve[:10])), "loss_last10": float(np.mean(curve[-10:])),
              "seconds": time.perf_counter() - started}
    (tmp / "general.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return record


def ensure_general_model(texts: list[str], texts_sha256: str, tokenizer_name: str, tokenizer: dict[str, str],
                         config: dict[str, Any], device: str) -> tuple[Path, dict[str, Any]]:
    """(model folder, record): the cached model for these inputs and settings, trained when missing."""
    key = general_key(texts_sha256, config["model"], config["general"], config["max_length"], tokenizer)
    out = cache_root() / "effect-general" / key
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process training the same model: wait for it, then reuse
        if (out / "general.json").exists():
            record = json.loads((out / "general.json").read_text(encoding="utf-8"))
            print(f"general model {key}: cached (held-out masked-token accuracy {record['held_out']['accuracy']:.4f})")
        else:
            print(f"general model {key}: training ({config['general']['steps']} steps)", flush=True)
            record = train_general_model(texts, tokenizer_name, config["model"], config["general"],
                                         config["max_length"], out, device)
    record["key"] = key
    if math.isnan(record["held_out"]["loss"]):
        raise SystemExit(f"general model {key}: held-out loss is nan")
    return out, record

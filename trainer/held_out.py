"""The held-out rows of `maskstream train` and their evaluation: which rows are never trained on, and the
loss, perplexity and masked-token accuracy on the first of them, masked the same way in every run."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.masking import apply_masking

log = logging.getLogger("maskstream.train")

EVAL_SEED = 20_230_523  # fixed: every run masks the held-out rows the same way
HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: 2^64 / golden ratio


def held_out(sample_index: np.ndarray, fraction: float) -> np.ndarray:
    """True for held-out rows: the top 24 bits of (sample_index * 0x9E3779B97F4A7C15 mod 2^64), read as
    a number in [0, 1), are below `fraction`. Depends on the row's global index only."""
    hashed = np.asarray(sample_index, dtype=np.uint64) * HASH_MULTIPLIER
    return (hashed >> np.uint64(40)).astype(np.float64) / float(1 << 24) < fraction


def collect_held_out(dataset_url: str, fraction: float, limit: int, pad_token_id: int, batch_size: int,
                     peer_columns: tuple[str, ...] = ()):
    """The first `limit` held-out rows in dataset order, collated into batches (unmasked), with the
    peer-signal columns the evaluation's strategy reads."""
    if limit <= 0:  # --eval-samples 0: no evaluation
        return []
    if fraction <= 0:  # no row is held out: reading the dataset would find none
        log.info("--held-out-fraction 0: no row is held out, so there is no held-out evaluation")
        return []
    reader = StreamingSequenceDataset(dataset_url, shuffle=False, rank=0, world_size=1, peer_columns=peer_columns)
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

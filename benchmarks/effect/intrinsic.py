"""Held-out MLM losses of one model, fair to every arm (issue 18, item 4).

On the held-out rows of `maskstream train` (the same rows for every arm and seed: a hash of the
row's index), masked with the trainer's fixed evaluation seed:

- `own`: the arm's own masking (its train flags' strategy on its own dataset's probabilities);
- `random`: the common random masking (BERT 15%), the same masks for every arm;
- `random_seed_similar` / `random_rest`: the `random` loss split by token: seed-similar tokens are
  those whose stored mask probability in the `main` dataset is at least the 90th percentile over
  the held-out tokens (the tokens difference masking favours); the rest is every other token.

Loss = mean negative log-likelihood over the masked tokens (nats).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SEED_SIMILAR_QUANTILE = 0.9
DEFINITION = ("Held-out rows of `maskstream train` (the same rows for every arm and seed), masked with the trainer's "
              "fixed evaluation seed. *Own masking*: the arm's own strategy (on its dataset's probabilities). "
              "*Common random masking*: BERT 15%, the same masks for every arm. *Seed-similar tokens*: the "
              "common-random loss on tokens whose stored `main` mask probability is at least the 90th percentile "
              "over the held-out tokens (the tokens difference masking favours); *other tokens*: the rest. "
              "Loss: mean negative log-likelihood over the masked tokens, in nats.")


def strategy_of(train_flags: tuple[str, ...] | list[str]) -> tuple[str, bool]:
    """(strategy, whole_word) from `maskstream train` flags (its defaults when absent)."""
    flags = list(train_flags)
    strategy = flags[flags.index("--strategy") + 1] if "--strategy" in flags else "difference"
    return strategy, "--whole-word" in flags


def token_losses(model, batches, strategy: str, masking, device: str) -> tuple[np.ndarray, np.ndarray]:
    """(negative log-likelihood, stored mask probability) of every masked held-out token."""
    import torch

    from trainer.exlm import HEAD_ATTRIBUTES
    from trainer.masking import apply_masking
    from trainer.train import EVAL_SEED

    head = getattr(model, next(name for name in HEAD_ATTRIBUTES if hasattr(model, name)))
    nll, probability = [], []
    model.eval()
    with torch.no_grad():
        for batch in batches:
            batch = apply_masking({k: v.to(device) for k, v in batch.items()}, strategy, masking, seed=EVAL_SEED,
                                  epoch=0)
            masked = batch["labels"] != -100
            hidden = model.base_model(input_ids=batch["input_ids"],
                                      attention_mask=batch["attention_mask"]).last_hidden_state
            logits = head(hidden[masked]).float()
            nll.append(torch.nn.functional.cross_entropy(logits, batch["labels"][masked], reduction="none").cpu())
            probability.append(batch["mask_probability"][masked].cpu())
    return torch.cat(nll).numpy().astype(np.float64), torch.cat(probability).numpy().astype(np.float64)


def held_out_losses(model_dir: Path | str, arm_dataset: str, main_dataset: str, train_flags, held_out_fraction: float,
                    eval_samples: int, device: str) -> dict[str, Any]:
    """The losses of the module docstring for the model saved in `model_dir`."""
    from trainer.dataset import StreamingSequenceDataset
    from trainer.masking import MaskingConfig
    from trainer.objectives import load_mlm_model
    from trainer.train import collect_held_out

    model = load_mlm_model(str(model_dir)).to(device)
    out: dict[str, Any] = {"definition": DEFINITION, "tokens": {}}

    def rows(root: str):
        manifest = StreamingSequenceDataset(root, shuffle=False).manifest
        batches = collect_held_out(root, held_out_fraction, eval_samples, manifest.tokenizer["pad_token_id"], 32)
        return manifest, batches

    main_manifest, main_batches = rows(main_dataset)
    nll, probability = token_losses(model, main_batches, "random", MaskingConfig.from_manifest(main_manifest), device)
    # the threshold over all held-out non-special tokens, not only the masked ones
    stored = np.concatenate([b["mask_probability"][~b["special_tokens_mask"]].numpy() for b in main_batches])
    threshold = float(np.quantile(stored, SEED_SIMILAR_QUANTILE))
    similar = probability >= threshold
    out["random"] = float(nll.mean())
    out["random_seed_similar"] = float(nll[similar].mean()) if similar.any() else None
    out["random_rest"] = float(nll[~similar].mean()) if (~similar).any() else None
    out["tokens"] = {"random": int(len(nll)), "random_seed_similar": int(similar.sum()),
                     "random_rest": int((~similar).sum())}
    out["seed_similar_threshold"] = threshold
    strategy, whole_word = strategy_of(train_flags) if train_flags else ("random", False)
    if (strategy, whole_word) == ("random", False) and train_flags:
        out["own"], out["tokens"]["own"] = out["random"], out["tokens"]["random"]  # the same masks
    elif train_flags:
        manifest, batches = (main_manifest, main_batches) if arm_dataset == main_dataset else rows(arm_dataset)
        own, _ = token_losses(model, batches, strategy, MaskingConfig.from_manifest(manifest, whole_word=whole_word),
                              device)
        out["own"], out["tokens"]["own"] = float(own.mean()), int(len(own))
    else:
        out["own"] = None  # no continued pretraining: no masking of its own
    out["own_strategy"] = {"strategy": strategy, "whole_word": whole_word} if train_flags else None
    return out

"""The optimizer of `maskstream train` and `finetune`: AdamW with a linear warm-up and decay."""

from __future__ import annotations


def build_optimizer(module, weight_decay: float, lr: float, warmup_steps: int, total_steps: int,
                    fused: bool | None = None):
    """AdamW over `module`'s parameters (no weight decay on biases and norms) and a linear warm-up then
    linear decay schedule; returns (optimizer, scheduler). `fused` is passed to AdamW as given."""
    # heavy (torch, transformers): `finetune`'s module, which imports this one, loads for `maskstream --help`
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

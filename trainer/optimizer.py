"""The optimizer of `maskstream train` and `finetune`: AdamW, no weight decay on biases and norms.
`train` sets its learning rate from the samples trained (`maskstream.trainer.plan`); `finetune`
steps transformers' linear warm-up and decay schedule."""

from __future__ import annotations


def adamw(module, weight_decay: float, lr: float, fused: bool | None = None):
    """AdamW over `module`'s parameters, biases and norms without weight decay; `fused` is passed
    to AdamW as given."""
    # heavy (torch): `finetune`'s module, which imports this one, loads for `maskstream --help`
    import torch

    no_decay = ("bias", "LayerNorm.weight", "layernorm.weight", "norm.weight")
    groups = [
        {"params": [p for n, p in module.named_parameters() if not n.endswith(no_decay)],
         "weight_decay": weight_decay},
        {"params": [p for n, p in module.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, fused=fused)


def build_optimizer(module, weight_decay: float, lr: float, warmup_steps: int, total_steps: int,
                    fused: bool | None = None):
    """`adamw` and a linear warm-up then linear decay schedule in steps; returns (optimizer, scheduler)."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    from transformers import get_linear_schedule_with_warmup

    optimizer = adamw(module, weight_decay, lr, fused)
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)


def set_learning_rate(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

"""The settings of one `maskstream train` run: `TrainConfig` (a field per flag, checked on creation) and
the settings a resumed run must keep. No torch at import: the command line builds it for `--help`."""

from __future__ import annotations

import dataclasses
from typing import Any

from maskstream.mask_signal.probability import check_budget
from maskstream.trainer.strategies import PRETRAINING_STRATEGIES, check_strategy


@dataclasses.dataclass
class TrainConfig:
    """The settings of one `maskstream train` run: the CLI flags (see `add_arguments` for each one's
    meaning), checked on construction."""

    dataset: str
    output: str
    model: str | None = None
    objective: str = "mlm"
    exlm_states: int = 4
    exlm_token_budget: int = 0
    strategy: str = "difference"
    whole_word: bool = False
    mask_budget: float = 0.15
    mask_budget_schedule: str = "constant"  # maskstream.trainer.masking.BudgetSchedule
    batch_size: int = 32
    grad_accumulation: int = 1
    epochs: float = 1.0
    max_steps: int = 0
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    max_grad_norm: float = 1.0
    seed: int = 0
    num_workers: int = 2
    held_out_fraction: float = 0.02
    eval_samples: int = 512
    eval_strategy: str = "random"
    eval_every: int = 500
    log_every: int = 10
    save_every: int = 1000
    resume: str | None = None  # a checkpoint folder, or "latest": the newest in OUTPUT/checkpoints
    compile: bool = False
    follow_latest: bool = False
    cache_dir: str | None = None  # a local cache of the shards (maskstream.trainer.shard_cache)
    cache_limit: int = 0  # its size in bytes; required with cache_dir
    sample_log: str | None = None  # a JSON-lines file: one line per sample trained
    mix: list[str] | None = None  # SOURCE:WEIGHT entries (maskstream.trainer.mixture)

    def __post_init__(self) -> None:
        # heavy: imports torch; only here, where it is needed
        from maskstream.trainer.masking import BudgetSchedule
        from maskstream.trainer.objectives import OBJECTIVES

        check_ranges(("--batch-size", self.batch_size, self.batch_size >= 1),
                     ("--grad-accumulation", self.grad_accumulation, self.grad_accumulation >= 1),
                     ("--held-out-fraction", self.held_out_fraction, 0 <= self.held_out_fraction < 1),
                     ("--warmup-ratio", self.warmup_ratio, 0 <= self.warmup_ratio <= 1),
                     ("--max-steps", self.max_steps, self.max_steps >= 0),
                     ("--log-every", self.log_every, self.log_every >= 1),
                     ("--eval-every", self.eval_every, self.eval_every >= 1),
                     ("--save-every", self.save_every, self.save_every >= 1),
                     ("--exlm-states", self.exlm_states, self.exlm_states >= 1),
                     ("--exlm-token-budget", self.exlm_token_budget, self.exlm_token_budget >= 0))
        check_budget(self.mask_budget, "--mask-budget")
        BudgetSchedule.parse(self.mask_budget_schedule, self.mask_budget)  # a bad schedule fails here
        if self.mix:
            # heavy: imports torch; only here, where it is needed
            from maskstream.trainer.mixture import MixSource, mixture_weights

            sources = [MixSource.parse(entry) for entry in self.mix]
            mixture_weights(sources)  # bad entries and sums fail here
            for source in sources:
                check_strategy(source.strategy, PRETRAINING_STRATEGIES, f"--mix {source.url} strategy")
        if self.cache_dir and self.cache_limit < 1:
            raise ValueError("--cache-dir needs --cache-limit BYTES, the most the cache may hold")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown --objective {self.objective!r}; choose one of {sorted(OBJECTIVES)}")
        for flag, strategy in (("--strategy", self.strategy), ("--eval-strategy", self.eval_strategy)):
            check_strategy(strategy, PRETRAINING_STRATEGIES, flag)



def check_ranges(*checks: tuple[str, Any, bool]) -> None:
    """Raises ValueError naming the first (option, value, in_range) check that fails."""
    for name, value, ok in checks:
        if not ok:
            raise ValueError(f"{name} {value} is out of range (see --help)")


# Settings that must be the same to continue a run. The dataset is checked on its own
# (`resume_versions`): a run that followed newer versions resumes on the one it was reading. The
# world size, batch size and worker count may change: the loader continues the epoch elastically
# (maskstream.trainer.dataset), and the plan is worked out again in samples (maskstream.trainer.plan).
RESUME_CRITICAL = ("model", "objective", "strategy", "mask_budget", "mask_budget_schedule", "whole_word",
                   "grad_accumulation", "seed", "held_out_fraction")
# What a checkpoint written before a setting existed meant by leaving it out.
RESUME_DEFAULTS = {"mask_budget_schedule": "constant"}

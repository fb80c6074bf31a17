"""Metric logs shared by `train` and `finetune`: a JSONL file and TensorBoard event files.

Each `log(step, split, values)` call appends `{"step", "split", **values}` to
`OUT/metrics.jsonl` and writes each number as the TensorBoard scalar `split/name` under
`OUT/tensorboard/`. A resumed run first drops the records after its resume step, so the log
reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    def __init__(self, out_dir: str | Path, resume_step: int | None = None, enabled: bool = True) -> None:
        self.enabled = enabled
        self.writer = None
        if not enabled:
            return
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / METRICS_FILE
        if resume_step is not None and self.path.exists():
            kept = [
                line
                for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line)["step"] <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        elif self.path.exists():
            self.path.unlink()
        # heavy: torch and transformers load only when a model is needed (--help stays fast)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"), purge_step=resume_step)

    def log(self, step: int, split: str, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "split": split, **values}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(f"{split}/{name}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """The records of `OUT/metrics.jsonl`, in order."""
    path = Path(out_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

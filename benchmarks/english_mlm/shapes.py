"""The pilot's first part: which BERT shapes the default masked LM may take.

For each candidate shape (MiniLM's WordPiece vocabulary, 128 positions), a model is built from its config and
timed on what `maskstream evaluate`'s TAPT does per step: the trainer's `MaskedLM` objective (logits at the
masked positions only), a batch of 32 x 128 tokens with 15 % masked, backward, AdamW, on one thread. The
median of the timed steps after two warm-up steps is the shape's step time. A shape is admissible when that
time is at most 1.4 s (the second-model issue's budget) and its fp16 weights are at most 50 MB.

    python -m benchmarks.english_mlm.shapes --out benchmarks/english_mlm/results/shapes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

CANDIDATES = {
    "4x256": {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
    "6x256": {"num_hidden_layers": 6, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
    "4x384": {"num_hidden_layers": 4, "hidden_size": 384, "num_attention_heads": 6, "intermediate_size": 1536},
    "6x384": {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 6, "intermediate_size": 1536},
}
MAX_STEP_SECONDS = 1.4
MAX_WEIGHT_BYTES = 50_000_000
POSITIONS = 128


def step_seconds(shape: dict[str, int], vocab_size: int, steps: int = 6, batch: int = 32, length: int = 128
                 ) -> tuple[float, int]:
    """(median seconds of a TAPT step, parameters) of a model of `shape` built from its config."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from maskstream.trainer.objectives import MaskedLM

    torch.manual_seed(0)
    objective = MaskedLM(BertForMaskedLM(BertConfig(vocab_size=vocab_size, max_position_embeddings=POSITIONS,
                                                    **shape)))
    optimizer = torch.optim.AdamW(objective.parameters(), lr=1e-4)
    ids = torch.randint(1000, vocab_size, (batch, length))
    labels = torch.where(torch.rand(batch, length) < 0.15, ids, torch.full_like(ids, -100))
    times = []
    for _ in range(steps + 2):
        started = time.perf_counter()
        objective(ids, torch.ones_like(ids), labels)["loss"].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:]), sum(p.numel() for p in objective.parameters())  # tied decoder once


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    vocab_size = 30522
    rows = {}
    for name, shape in CANDIDATES.items():
        seconds, parameters = step_seconds(shape, vocab_size)
        rows[name] = {"shape": shape, "parameters": parameters, "fp16_bytes": 2 * parameters,
                      "tapt_step_seconds": round(seconds, 3),
                      "admissible": seconds <= MAX_STEP_SECONDS and 2 * parameters <= MAX_WEIGHT_BYTES}
        print(f"{name}: {parameters / 1e6:.1f} M parameters, {2 * parameters / 1e6:.0f} MB fp16, "
              f"TAPT step {seconds:.2f} s (one thread)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"torch_threads": 1, "batch": [32, 128], "candidates": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

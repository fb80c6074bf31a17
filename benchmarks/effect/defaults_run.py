"""The default runs of issues 60 and 74: `maskstream evaluate` as a user runs it, every option at its default
but the labeled file, its label field and where the output and the scratch go (PILOT.md, "What follows the
pilot"; DEFAULT_PILOT.md, "What follows"). Issue 74's runs, at the defaults its pilot chose for the shipped
masked LM, go to RESULTS/defaults-english/TASK/; issue 60's, with the MiniLM, stay in RESULTS/defaults/TASK/.

    python -m benchmarks.effect.defaults_run shipped --results-root RESULTS   # data/debian-science.jsonl
    python -m benchmarks.effect.defaults_run second --results-root RESULTS    # the pinned docstring task

It starts the command itself, `python -m maskstream evaluate --labeled L --label-field F --output OUT --work W`,
twice, as --help says two processes on two cores share the work. While they run it commits, to
RESULTS/defaults-english/TASK/ (`git commit --only`), each finished (arm, seed)'s line with the report, and each
finished fold's readout under readouts/KEY/ (KEY: the prepared evaluation's hash of its inputs), so a fresh
clone continues where a session stopped: it prepares first (the same code as the command), then copies the
readouts committed under its own KEY back into the work folder, then starts the commands. A readout of other
inputs (other library versions, another model) is never restored. Run it from a clone of the commit that sets the defaults, its packages linked into the
clone's maskstream/ (it checks them), with --results-root pointing at the checkout the results are committed in.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.effect.configs import SECOND_TASK
from benchmarks.effect.ours import LABELED, REPO, commit, run_seconds
from benchmarks.effect.pilot import check_frozen
from maskstream.cli.config import config_of
from maskstream.cli.evaluate import add_arguments
from maskstream.evaluate.design import PRIMARY_METRIC, EvaluateConfig
from maskstream.evaluate.experiment import prepare, read_jsonl
from maskstream.evaluate.report import write_report
from maskstream.pipelines.dataset.core.tokenizer_facts import cache_root

TASKS = {"shipped": {"path": LABELED.relative_to(REPO).as_posix(), "label_field": "section", "sha256": None},
         "second": SECOND_TASK}
PROCESSES = 2
FOLDER = "defaults-english"  # issue 74's runs; issue 60's (the MiniLM's) are in RESULTS/defaults/
POLL_SECONDS = 30


def command_line(task: str, output: Path, work: Path) -> list[str]:
    """`maskstream evaluate`'s arguments for TASK: nothing but the labeled file, its label field, the output
    and the scratch folder."""
    spec = TASKS[task]
    return ["--labeled", str(REPO / spec["path"]), "--label-field", spec["label_field"],
            "--output", str(output), "--work", str(work)]


def parsed(arguments: list[str]) -> argparse.Namespace:
    """`maskstream evaluate`'s own parser applied to `arguments`."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(arguments)


def readouts(work: Path) -> list[Path]:
    """Each finished fold's readout under `work`, relative to it."""
    return sorted(p.relative_to(work) for p in work.rglob("readout.json"))


def copy_readouts(source: Path, target: Path) -> list[Path]:
    """Copies the readouts under `source` missing from `target`, in the same layout (never overwriting one);
    returns the new copies. Saves a work folder's readouts, and restores them into a prepared one."""
    new = []
    for relative in readouts(source) if source.exists() else []:
        if not (target / relative).exists():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / relative, target / relative)
            new.append(target / relative)
    return new


def arm_lines(results: Path) -> list[dict]:
    return [r for r in read_jsonl(results) if r.get("kind") == "arm"]


def run(task: str, root: Path) -> int:
    check_frozen()  # every package from this clone, so the command runs the commit it names
    spec = TASKS[task]
    if spec["sha256"] and hashlib.sha256((REPO / spec["path"]).read_bytes()).hexdigest() != spec["sha256"]:
        raise SystemExit(f"{spec['path']}: not the pinned bytes (configs.py)")
    output = root / FOLDER / task
    work, saved = cache_root() / "evaluate-defaults" / task, output / "readouts"
    arguments = command_line(task, output, work)
    args = parsed(arguments)
    output.mkdir(parents=True, exist_ok=True)
    key = prepare(config_of(EvaluateConfig, args))["root"]  # first: a missing work folder starts afresh
    print(f"restored {len(copy_readouts(saved / key, work / key))} committed readouts of {key}", flush=True)
    results = output / "results.jsonl"
    expected = 1 + len([a for a in args.arms if a != "none"]) * len(args.seeds)  # `none` runs once
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    print("running, twice: python -m maskstream evaluate " + " ".join(arguments), flush=True)
    logs = [(work / f"evaluate-{i}.log").open("ab") for i in range(PROCESSES)]
    processes = [subprocess.Popen([sys.executable, "-m", "maskstream", "evaluate", *arguments], cwd=REPO, env=env,
                                  stdout=log, stderr=subprocess.STDOUT) for log in logs]

    def commit_new(announced: int) -> int:
        """Commits the readouts not yet saved and, when results.jsonl has whole lines only, the lines not yet
        committed with the report; returns the lines committed so far."""
        new_readouts = copy_readouts(work, saved)
        records = arm_lines(results)
        whole = results.exists() and results.read_bytes().endswith(b"\n")  # no line half-appended
        if whole and len(records) > announced:
            write_report(results, output / "REPORT.md", margin=args.margin, planned=len(args.seeds))
            what = ", ".join(f"{r['arm']} seed {r['seed']} {100 * r[PRIMARY_METRIC]:.2f}" for r in records[announced:])
            commit(output, [saved, results, output / "REPORT.md", *output.glob("differences-*.png")],
                   f"evaluate at its defaults (issue 74), {task} task: {what}")
            return len(records)
        if new_readouts:
            commit(output, [saved], f"evaluate at its defaults (issue 74), {task} task: {len(new_readouts)} "
                                    "fold readout(s)")
        return announced

    announced = len(arm_lines(results))  # committed by an earlier session
    while any(p.poll() is None for p in processes):
        time.sleep(POLL_SECONDS)
        announced = commit_new(announced)
    announced = commit_new(announced)
    for log in logs:
        log.close()
    codes = [p.returncode for p in processes]
    lines = arm_lines(results)
    done = len({(r["arm"], r["seed"]) for r in lines})
    print(f"exit codes {codes}; {done} of {expected} (arm, seed) lines, {sum(map(run_seconds, lines)):,.0f} s "
          f"of TAPT + probe; logs in {work}", flush=True)
    return 0 if done == expected and not any(codes) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--results-root", type=Path, default=REPO / "benchmarks" / "effect" / "results",
                        help=f"where RESULTS/{FOLDER}/TASK/ is written and committed (default: this checkout's)")
    args = parser.parse_args(argv)
    return run(args.task, args.results_root)


if __name__ == "__main__":
    sys.exit(main())

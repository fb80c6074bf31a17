"""The pilot of issue 60, as PILOT.md fixes it: the control (`random − none`) of `maskstream evaluate` over
model × learning rate × TAPT passes, on the shipped task, one seed a cell.

    python -m benchmarks.effect.pilot run        # every cell in PILOT.md's order; two processes share the work
    python -m benchmarks.effect.pilot summary    # results/pilot/SUMMARY.md from results/pilot/results.jsonl

`run` calls `maskstream evaluate`'s library (the same code as the command) once per cell, with one
results.jsonl for all cells (each cell is its own evaluation in it), and commits each finished (arm, seed)
with the report and the summary (`git commit --only`), so a fresh clone continues where a session stopped.
Run it from a clone of the commit that adds PILOT.md, with --results-root pointing at the checkout where
the results are committed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.effect.configs import GENERAL_CORPUS
from benchmarks.effect.ours import LABELED, REPO, commit, general_model
from maskstream.evaluate.design import PRIMARY_METRIC, EvaluateConfig
from maskstream.evaluate.experiment import evaluate
from maskstream.evaluate.report import load, write_report
from maskstream.models import default_model
from maskstream.pipelines.dataset.core.tokenizer_facts import cache_root

SEED = 100
GAINS_AT = 1.0  # points: a cell gains when random − none is at least this (the evaluation's margin)
FEWER_PASSES_WITHIN = 0.5  # points: cells this close to the best go to the fewest passes


@dataclass(frozen=True)
class Cell:
    number: int
    model: str  # "minilm" or "small"
    learning_rate: float
    passes: float


GRID = (Cell(1, "minilm", 1e-4, 5), Cell(2, "minilm", 3e-4, 5), Cell(3, "minilm", 3e-5, 5),
        Cell(4, "small", 3e-4, 10), Cell(5, "small", 1e-4, 10), Cell(6, "small", 3e-4, 40),
        Cell(7, "small", 1e-4, 40), Cell(8, "minilm", 1e-4, 20), Cell(9, "minilm", 3e-4, 20),
        Cell(10, "minilm", 3e-5, 20))
SETTINGS = {"label_field": "section", "arms": ("none", "random"), "seeds": (SEED,), "batch_size": 32,
            "max_length": 128, "folds": 2, "probe_folds": 5, "margin": 0.01, "threads": 1, "device": "cpu"}


def cell_config(cell: Cell, output: Path) -> EvaluateConfig:
    if cell.model == "small":
        model, general = str(general_model("small")), [str(REPO / GENERAL_CORPUS["path"])]
    else:
        model, general = default_model(), None
    return EvaluateConfig(labeled=str(LABELED), output=output, model=model, general_corpus=general,
                          passes=(cell.passes,), learning_rate=cell.learning_rate,
                          work=cache_root() / "evaluate-pilot", **SETTINGS)


def gains(results: Path) -> dict[int, dict[str, Any]]:
    """Each finished cell's none and random scores and its gain, in points. A cell is found by its
    evaluation's prepared line (model, learning rate) and the arm line's passes."""
    kinds = load(results)
    model_names = {"minilm": Path(default_model()).name, "small": general_model("small").name}
    out: dict[int, dict[str, Any]] = {}
    for cell in GRID:
        bases = {p["base_hash"] for p in kinds["prepared"] if p["model"]["name"] == model_names[cell.model]
                 and p["settings"]["learning_rate"] == cell.learning_rate}
        lines = [r for r in kinds["arm"] if r["base_hash"] in bases]
        none = next((r for r in lines if r["arm"] == "none"), None)
        random = next((r for r in lines if r["arm"] == "random" and r["seed"] == SEED
                       and r["passes"] == cell.passes), None)
        if none is None or random is None:
            continue
        out[cell.number] = {"none": 100 * none[PRIMARY_METRIC], "random": 100 * random[PRIMARY_METRIC],
                            "gain": 100 * (random[PRIMARY_METRIC] - none[PRIMARY_METRIC]),
                            "tapt_minutes": sum(f["seconds"]["tapt"] for f in random["folds"]) / 60}
    return out


def chosen(found: dict[int, dict[str, Any]]) -> Cell | None:
    """PILOT.md's rule: the cell whose passes and learning rate become the defaults (None until all are in)."""
    if len(found) < len(GRID):
        return None
    minilm = [c for c in GRID if c.model == "minilm"]
    best = max(found[c.number]["gain"] for c in minilm)
    if best >= GAINS_AT:
        close = [c for c in minilm if found[c.number]["gain"] >= best - FEWER_PASSES_WITHIN]
        return min(close, key=lambda c: (c.passes, -found[c.number]["gain"]))
    return max(minilm, key=lambda c: found[c.number]["gain"])


def choice(found: dict[int, dict[str, Any]]) -> str:
    """PILOT.md's rule, once all cells are in, as SUMMARY.md says it."""
    cell = chosen(found)
    if cell is None:
        return f"Incomplete: {len(found)} of {len(GRID)} cells in. The rule is read once all are in."
    best = max(found[c.number]["gain"] for c in GRID if c.model == "minilm")
    if best >= GAINS_AT:
        verdict = f"a MiniLM cell gains (best +{best:.2f} points)"
    else:
        verdict = (f"no MiniLM cell gains {GAINS_AT:g} point or more (best {best:+.2f}): the control failed at every "
                   "MiniLM setting tried")
    return (f"**Chosen (rule {3 if best >= GAINS_AT else 4}):** cell {cell.number}, learning rate "
            f"{cell.learning_rate:g}, {cell.passes:g} passes; {verdict}.")


def write_summary(root: Path) -> Path:
    found = gains(root / "results.jsonl") if (root / "results.jsonl").exists() else {}
    rows = ["# Pilot of issue 60: the control of `maskstream evaluate` per cell", "",
            "Generated by `python -m benchmarks.effect.pilot summary` from `results.jsonl`; the rule is "
            "benchmarks/effect/PILOT.md's. Probe macro-F1 in points, seed 100; intervals in REPORT.md.", "",
            "| cell | model | learning rate | passes | none | random | random − none | TAPT min (2 folds) |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for cell in GRID:
        f = found.get(cell.number)
        figures = (f"{f['none']:.2f} | {f['random']:.2f} | {f['gain']:+.2f} | {f['tapt_minutes']:.1f}" if f
                   else "– | – | – | –")
        rows.append(f"| {cell.number} | {cell.model} | {cell.learning_rate:g} | {cell.passes:g} | {figures} |")
    rows += ["", choice(found), ""]
    path = root / "SUMMARY.md"
    path.write_text("\n".join(rows), encoding="utf-8")
    return path


def check_frozen() -> None:
    """Every maskstream package comes from this checkout. Run from another clone with the project's venv,
    the editable install maps `maskstream.pipelines`, `.trainer`, `.schemas` and `.mask_signal` to the
    checkout it was installed from (PILOT.md's amendment): link them into the clone's maskstream/ first."""
    import maskstream.mask_signal
    import maskstream.pipelines
    import maskstream.schemas
    import maskstream.trainer

    packages = (maskstream.pipelines, maskstream.trainer, maskstream.schemas, maskstream.mask_signal)
    elsewhere = [f"{p.__name__} ({Path(p.__file__).parent})" for p in packages
                 if REPO not in Path(p.__file__).resolve().parents]
    if elsewhere:
        raise SystemExit(f"not frozen: {', '.join(elsewhere)} load from outside {REPO}; in the clone, "
                         "`ln -s ../pipelines ../trainer ../schemas ../mask_signal maskstream/`")


def run(root: Path) -> None:
    check_frozen()
    for cell in GRID:
        def committed(record: dict[str, Any], cell: Cell = cell) -> None:
            write_report(root / "results.jsonl", root / "REPORT.md", margin=SETTINGS["margin"], planned=None)
            summary = write_summary(root)
            commit(root, [root / "results.jsonl", root / "REPORT.md", summary, *root.glob("differences-*.png")],
                   f"evaluate pilot (issue 60), cell {cell.number} ({cell.model}, lr {cell.learning_rate:g}, "
                   f"{cell.passes:g} passes): {record['arm']}, probe macro-F1 {100 * record[PRIMARY_METRIC]:.2f}")

        print(f"pilot cell {cell.number}: {cell}", flush=True)
        evaluate(cell_config(cell, root), on_result=committed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("run", "summary"))
    parser.add_argument("--results-root", type=Path, default=REPO / "benchmarks" / "effect" / "results" / "pilot",
                        help="where the pilot's results are written and committed (default: this checkout's)")
    args = parser.parse_args(argv)
    args.results_root.mkdir(parents=True, exist_ok=True)
    if args.stage == "run":
        run(args.results_root)
    print(f"wrote {write_summary(args.results_root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

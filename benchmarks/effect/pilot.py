"""The pilots that chose `maskstream evaluate`'s defaults: the control (`random − none`) over model ×
learning rate × TAPT passes, on the shipped task, one seed a cell. Two grids, each with its rule written and
committed before its first result:

- `issue-60` (PILOT.md): the MiniLM and the committed `small` model; results/pilot/.
- `default-model` (DEFAULT_PILOT.md, issue 74): the shipped general-English masked LM
  (`maskstream.models.default_mlm`); results/default-pilot/.

    python -m benchmarks.effect.pilot run --grid default-model       # every cell in order; two processes share it
    python -m benchmarks.effect.pilot summary --grid default-model   # SUMMARY.md from the grid's results.jsonl

`run` calls `maskstream evaluate`'s library (the same code as the command) once per cell, with one
results.jsonl for all cells (each cell is its own evaluation in it), and commits each finished (arm, seed)
with the report and the summary (`git commit --only`), so a fresh clone continues where a session stopped.
Run it from a clone of the commit that adds the grid's rule, with --results-root pointing at the checkout
where the results are committed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.effect.configs import GENERAL_CORPUS
from benchmarks.effect.ours import LABELED, REPO, commit, general_model, whole_tapt_seconds
from maskstream.evaluate.design import PRIMARY_METRIC, EvaluateConfig
from maskstream.evaluate.experiment import evaluate
from maskstream.evaluate.report import load, write_report
from maskstream.models import default_mlm, default_model
from maskstream.pipelines.dataset.core.tokenizer_facts import cache_root

SEED = 100
GAINS_AT = 1.0  # points: a cell gains when random − none is at least this (the evaluation's margin)
FEWER_PASSES_WITHIN = 0.5  # points: issue 60's cells this close to the best go to the fewest passes
CEILING_SECONDS = 3600.0  # DEFAULT_PILOT.md: a default run's projected TAPT + probe seconds
TRAINED_LINES = 10  # DEFAULT_PILOT.md: a default run's `random` and `difference` lines, 5 seeds each


@dataclass(frozen=True)
class Cell:
    number: int
    model: str  # "minilm", "small" or "english" (the shipped general-English masked LM)
    learning_rate: float
    passes: float


@dataclass(frozen=True)
class Choice:
    cell: Cell
    rule: int  # the rule of the grid's document that chose it
    verdict: str


@dataclass(frozen=True)
class Pilot:
    name: str  # --grid
    issue: int
    rule_document: str  # in benchmarks/effect/
    results_folder: str  # under benchmarks/effect/results/
    grid: tuple[Cell, ...]
    choose: Callable[[dict[int, dict[str, Any]]], Choice]  # the rule, once every cell is in


def choose_issue_60(found: dict[int, dict[str, Any]]) -> Choice:
    """PILOT.md's rule: among the MiniLM cells, the fewest passes within half a point of the best gain if
    that gains; otherwise the best gain."""
    minilm = [c for c in ISSUE_60.grid if c.model == "minilm"]
    best = max(found[c.number]["gain"] for c in minilm)
    if best >= GAINS_AT:
        close = [c for c in minilm if found[c.number]["gain"] >= best - FEWER_PASSES_WITHIN]
        cell = min(close, key=lambda c: (c.passes, -found[c.number]["gain"]))
        return Choice(cell, 3, f"a MiniLM cell gains (best +{best:.2f} points)")
    return Choice(max(minilm, key=lambda c: found[c.number]["gain"]), 4,
                  f"no MiniLM cell gains {GAINS_AT:g} point or more (best {best:+.2f}): the control failed at "
                  "every MiniLM setting tried")


def choose_default_model(found: dict[int, dict[str, Any]]) -> Choice:
    """DEFAULT_PILOT.md's rule: the passing cell within the cost ceiling with the fewest passes (then the
    larger gain); else the passing cell with the lowest projected cost; else the largest gain."""
    cells = DEFAULT_MLM_PILOT.grid
    passing = [c for c in cells if found[c.number]["gain"] >= GAINS_AT]
    within = [c for c in passing if found[c.number]["projected_seconds"] <= CEILING_SECONDS]
    if within:
        cell = min(within, key=lambda c: (c.passes, -found[c.number]["gain"]))
        return Choice(cell, 3, f"{len(passing)} of {len(cells)} cells pass, {len(within)} of them within "
                               f"{CEILING_SECONDS:.0f} s")
    if passing:
        cell = min(passing, key=lambda c: found[c.number]["projected_seconds"])
        return Choice(cell, 4, f"{len(passing)} of {len(cells)} cells pass, none within {CEILING_SECONDS:.0f} s: "
                               f"the cheapest passing cell, a default run projected at "
                               f"{found[cell.number]['projected_seconds']:.0f} s")
    best = max(cells, key=lambda c: found[c.number]["gain"])
    return Choice(best, 5, f"no cell gains {GAINS_AT:g} point or more (best {found[best.number]['gain']:+.2f}): "
                           "the control failed in the pilot at every setting tried")


ISSUE_60 = Pilot("issue-60", 60, "PILOT.md", "pilot", (
    Cell(1, "minilm", 1e-4, 5), Cell(2, "minilm", 3e-4, 5), Cell(3, "minilm", 3e-5, 5),
    Cell(4, "small", 3e-4, 10), Cell(5, "small", 1e-4, 10), Cell(6, "small", 3e-4, 40),
    Cell(7, "small", 1e-4, 40), Cell(8, "minilm", 1e-4, 20), Cell(9, "minilm", 3e-4, 20),
    Cell(10, "minilm", 3e-5, 20)), choose_issue_60)
DEFAULT_MLM_PILOT = Pilot("default-model", 74, "DEFAULT_PILOT.md", "default-pilot", (
    Cell(1, "english", 1e-4, 1), Cell(2, "english", 3e-4, 1), Cell(3, "english", 1e-4, 2),
    Cell(4, "english", 3e-4, 2), Cell(5, "english", 1e-4, 4), Cell(6, "english", 3e-4, 4),
    Cell(7, "english", 1e-4, 8), Cell(8, "english", 3e-4, 8)), choose_default_model)
PILOTS = {p.name: p for p in (ISSUE_60, DEFAULT_MLM_PILOT)}
SETTINGS = {"label_field": "section", "arms": ("none", "random"), "seeds": (SEED,), "batch_size": 32,
            "max_length": 128, "folds": 2, "probe_folds": 5, "margin": 0.01, "threads": 1, "device": "cpu"}


def model_path(model: str) -> str:
    """What loads a cell's model."""
    if model == "small":
        return str(general_model("small"))
    return default_mlm() if model == "english" else default_model()


def cell_config(pilot: Pilot, cell: Cell, output: Path) -> EvaluateConfig:
    general = [str(REPO / GENERAL_CORPUS["path"])] if cell.model == "small" else None
    return EvaluateConfig(labeled=str(LABELED), output=output, model=model_path(cell.model), general_corpus=general,
                          passes=(cell.passes,), learning_rate=cell.learning_rate,
                          work=cache_root() / f"evaluate-{pilot.results_folder}", **SETTINGS)


def gains(results: Path, pilot: Pilot = ISSUE_60) -> dict[int, dict[str, Any]]:
    """Each finished cell's none and random scores and its gain, in points, and a default run's projected
    TAPT + probe seconds (`projected_seconds`; a resumed TAPT's seconds scaled to all its steps, and the cell
    marked `resumed`). A cell is found by its evaluation's prepared line (model, learning
    rate) and the arm line's passes."""
    kinds = load(results)
    names = {m: Path(model_path(m)).name for m in {c.model for c in pilot.grid}}
    out: dict[int, dict[str, Any]] = {}
    for cell in pilot.grid:
        bases = {p["base_hash"] for p in kinds["prepared"] if p["model"]["name"] == names[cell.model]
                 and p["settings"]["learning_rate"] == cell.learning_rate}
        lines = [r for r in kinds["arm"] if r["base_hash"] in bases]
        none = next((r for r in lines if r["arm"] == "none"), None)
        random = next((r for r in lines if r["arm"] == "random" and r["seed"] == SEED
                       and r["passes"] == cell.passes), None)
        if none is None or random is None:
            continue
        out[cell.number] = {"none": 100 * none[PRIMARY_METRIC], "random": 100 * random[PRIMARY_METRIC],
                            "gain": 100 * (random[PRIMARY_METRIC] - none[PRIMARY_METRIC]),
                            "tapt_minutes": sum(whole_tapt_seconds(f) for f in random["folds"]) / 60,
                            "projected_seconds": sum(f["seconds"]["probe"] for f in none["folds"]) + TRAINED_LINES * sum(
                                whole_tapt_seconds(f) + f["seconds"]["probe"] for f in random["folds"]),
                            "resumed": any((f.get("pretraining") or {}).get("resumed_from_step")
                                           for f in random["folds"])}
    return out


def chosen(found: dict[int, dict[str, Any]], pilot: Pilot = ISSUE_60) -> Choice | None:
    """The grid's rule: the cell whose passes and learning rate become the defaults (None until all are in)."""
    return pilot.choose(found) if len(found) == len(pilot.grid) else None


def choice(found: dict[int, dict[str, Any]], pilot: Pilot = ISSUE_60) -> str:
    """The grid's rule, once all cells are in, as SUMMARY.md says it."""
    made = chosen(found, pilot)
    if made is None:
        return f"Incomplete: {len(found)} of {len(pilot.grid)} cells in. The rule is read once all are in."
    cell = made.cell
    return (f"**Chosen (rule {made.rule}):** cell {cell.number}, learning rate {cell.learning_rate:g}, "
            f"{cell.passes:g} passes; {made.verdict}.")


def write_summary(root: Path, pilot: Pilot = ISSUE_60) -> Path:
    found = gains(root / "results.jsonl", pilot) if (root / "results.jsonl").exists() else {}
    cost = pilot is DEFAULT_MLM_PILOT  # issue 60's rule had no ceiling: its table stays as it was
    rows = [f"# Pilot of issue {pilot.issue}: the control of `maskstream evaluate` per cell", "",
            f"Generated by `python -m benchmarks.effect.pilot summary --grid {pilot.name}` from `results.jsonl`; "
            f"the rule is benchmarks/effect/{pilot.rule_document}'s. Probe macro-F1 in points, seed {SEED}; "
            "intervals in REPORT.md." + (" Projected cost: a default run's TAPT + probe seconds, `none`'s probe "
                                         f"+ {TRAINED_LINES} × this `random` line's." if cost else ""), "",
            "| cell | model | learning rate | passes | none | random | random − none | TAPT min (2 folds) |"
            + (" projected cost (s) |" if cost else ""),
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |" + (" ---: |" if cost else "")]
    for cell in pilot.grid:
        f = found.get(cell.number)
        figures = (f"{f['none']:.2f} | {f['random']:.2f} | {f['gain']:+.2f} | {f['tapt_minutes']:.1f}"
                   + (f" | {f['projected_seconds']:.0f}" if cost else "") if f else " | ".join(["–"] * (4 + cost)))
        resumed = " (resumed: TAPT seconds scaled to all its steps)" if f and f["resumed"] else ""
        rows.append(f"| {cell.number}{resumed} | {cell.model} | {cell.learning_rate:g} | {cell.passes:g} | {figures} |")
    rows += ["", choice(found, pilot), ""]
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


def run(root: Path, pilot: Pilot) -> None:
    check_frozen()
    for cell in pilot.grid:
        def committed(record: dict[str, Any], cell: Cell = cell) -> None:
            write_report(root / "results.jsonl", root / "REPORT.md", margin=SETTINGS["margin"], planned=None)
            summary = write_summary(root, pilot)
            commit(root, [root / "results.jsonl", root / "REPORT.md", summary, *root.glob("differences-*.png")],
                   f"evaluate pilot (issue {pilot.issue}), cell {cell.number} ({cell.model}, lr "
                   f"{cell.learning_rate:g}, {cell.passes:g} passes): {record['arm']}, probe macro-F1 "
                   f"{100 * record[PRIMARY_METRIC]:.2f}")

        print(f"pilot cell {cell.number}: {cell}", flush=True)
        evaluate(cell_config(pilot, cell, root), on_result=committed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("run", "summary"))
    parser.add_argument("--grid", choices=sorted(PILOTS), default=ISSUE_60.name,
                        help="which pilot (default: issue-60, the one its results were written by)")
    parser.add_argument("--results-root", type=Path,
                        help="where the pilot's results are written and committed (default: this checkout's "
                             "benchmarks/effect/results/<the grid's folder>)")
    args = parser.parse_args(argv)
    pilot = PILOTS[args.grid]
    root = args.results_root or REPO / "benchmarks" / "effect" / "results" / pilot.results_folder
    root.mkdir(parents=True, exist_ok=True)
    if args.stage == "run":
        run(root, pilot)
    print(f"wrote {write_summary(root, pilot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

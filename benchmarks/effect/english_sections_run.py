"""Issue 76's run of `maskstream evaluate`, as ENGLISH_SECTIONS.md fixes it: issue 61's 27,513 labeled Debian
descriptions (25 sections), with the same clusters, folds and seed words, but every arm starting from the shipped
general-English masked LM (`maskstream/english_mlm/`); TAPT of S steps at learning rate LR, both from the
default-model pilot (DEFAULT_PILOT.md); a pilot that sizes the run, then the confirmatory seeds.

    python -m benchmarks.effect.english_sections_run --results-root RESULTS   # twice, side by side: they share the work

Before any result (each check refuses with a line that says why):
1. the packages load from this clone (`pilot.check_frozen`) and the libraries are the run's (`check_versions`);
   the task is the file `configs.SECTIONS_TASK` pins; the model's identity is MODEL_IDENTITY, computed from the
   clone's folder and recorded in every prepared line of the default pilot; the general-English corpus
   (rebuilt from its pinned archives when missing) holds the pinned texts;
2. prepare alone. The prepared line it gives (the model's identity checked again in it) is compared with issue
   61's, field by field (`same_task`), into RESULTS/sections-english/same_task.json;
3. the TAPT plan (`tapt_plan`): the default pilot's chosen cell (P passes, learning rate LR), S steps a fold from
   this run's rows, cut to what 16 CPU-hours afford at 5 seeds when that is less, in
   RESULTS/sections-english/tapt_plan.json, committed with same_task.json before the first pilot line (a resumed
   run reads the committed plan).
Then the phases, each finished (arm, seed) committed with its report (`git commit --only`), so a fresh clone
continues where a session stopped:
4. `pilot` (seeds PILOT_SEEDS, results in RESULTS/sections-english/pilot/): its text and seed variance and its
   cost fix N, written to RESULTS/sections-english/seed_plan.json and committed before the first confirmatory run;
5. `confirmatory` (seeds 0 .. N - 1, RESULTS/sections-english/confirmatory/): the decision, read once all N are in.

Run it from a clone of ENGLISH_SECTIONS.md's last commit (the one that fills in its model and pilot table), its
packages linked into the clone's maskstream/ (it checks them), with --results-root pointing at the checkout where
the results are committed. Issue 61's prepared line and the default pilot's results are read from the clone: the
committed files the plan is fixed on.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from benchmarks.effect.configs import SECTIONS_TASK
from benchmarks.effect.ours import REPO, check_versions, commit, phase, run_seconds
from benchmarks.effect.pilot import DEFAULT_MLM_PILOT, check_frozen, chosen, gains
from benchmarks.effect.sections_run import EFFECT, MAX_SEEDS, MIN_SEEDS, PHASES, PILOT_SEEDS
from benchmarks.effect.sections_run import SETTINGS as SECTIONS_SETTINGS
from benchmarks.effect.sections_run import seed_plan as sections_seed_plan
from benchmarks.english_mlm.pretrain import pinned_texts
from maskstream.evaluate.design import EvaluateConfig
from maskstream.evaluate.experiment import Evaluation, claim, model_identity, prepare
from maskstream.evaluate.report import load
from maskstream.evaluate.statistics import hierarchical_power, projected_variance
from maskstream.models import default_mlm
from maskstream.pipelines.dataset.core.tokenizer_facts import cache_root
from maskstream.schemas.manifest import sha256_file

# ENGLISH_SECTIONS.md, "The model and the pilot's cell": `evaluate`'s `model` entry of the shipped model,
# {"name": "english_mlm", "sha256": "..."} (`model_identity(default_mlm())`), set once the model was committed
# (0dd6651), before the commit that fills in the document's table; run() refuses to start while it is None.
MODEL_IDENTITY: dict[str, str] | None = {
    "name": "english_mlm", "sha256": "033586ced35f68eb7f01d2b52dd7887330f64378b48a301e6d4740609dead2b6"}
# The general-English corpus, rebuilt from its pinned archives; its texts' sha256 is pretrain.TEXTS_SHA256.
CORPUS = REPO / "out" / "english_mlm" / "corpus.jsonl.gz"
RESULTS = REPO / "benchmarks" / "effect" / "results"
ISSUE_61 = RESULTS / "sections" / "confirmatory" / "results.jsonl"  # its first line: issue 61's prepared line
DEFAULT_PILOT_RESULTS = RESULTS / DEFAULT_MLM_PILOT.results_folder / "results.jsonl"
# ENGLISH_SECTIONS.md: what decides the run besides S and LR (the tapt plan's), issue 61's (sections_run.SETTINGS)
FOLDS, BATCH_SIZE = SECTIONS_SETTINGS["folds"], SECTIONS_SETTINGS["batch_size"]
TRAINED_ARMS = sum(1 for arm in SECTIONS_SETTINGS["arms"] if arm != "none")  # `random` and `difference`
BUDGET_SECONDS = 16 * 3600  # the default pilot (D), this run's pilot and the confirmatory run, in seconds of one core
PROBE_SECONDS = 94.6  # p: the estimated probe seconds of a TAPT fold (twice issue 61's 47.3)
NONE_SECONDS = 446.4  # n0: the estimated seconds of a `none` line, 2 folds (twice issue 61's 111.6 a fold)
CAP_SEEDS = MIN_SEEDS  # the cap on S: what fits at N = 5

# "The same texts, clusters and folds: the check": fields that must be equal as they are
EQUAL_FIELDS = ("files", "labels", "counts", "labeled", "clusters", "leaks_after_cleaning")
IN_ORDER_FIELDS = ("truth", "cluster_ids")  # each fold's labels and cluster ids, in order
CLEANED_FOLDS = tuple(f"tapt/fold{f}" for f in range(FOLDS))


# --- the model, the task, the corpus ----------------------------------------------------------------------


def check_model(identity_expected: dict[str, Any] | None, found: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pre-registered identity must be `model_identity(default_mlm())`, the clone's folder, and every
    identity in `found` (where it is recorded -> the `model` entry there: the default pilot's prepared lines,
    this run's). Refuses with the places that differ; returns the clone's identity."""
    if identity_expected is None:
        raise SystemExit("MODEL_IDENTITY is not set: the model's identity is filled in once it is committed "
                         "(ENGLISH_SECTIONS.md, \"The model and the pilot's cell\"); the run does not start before")
    clone = model_identity(default_mlm())
    places = {f"the clone's {Path(default_mlm()).name}/": clone, **(found or {})}
    wrong = [f"{where}: {identity}" for where, identity in places.items() if identity != identity_expected]
    if wrong:
        raise SystemExit(f"not the pre-registered model {identity_expected}: {'; '.join(wrong)}")
    return clone


def check_task(path: Path = REPO / SECTIONS_TASK["path"]) -> None:
    sha = sha256_file(str(path))
    if sha != SECTIONS_TASK["sha256"]:
        raise SystemExit(f"{path}: sha256 {sha}, not the task configs.SECTIONS_TASK pins ({SECTIONS_TASK['sha256']})")


def general_corpus(path: Path = CORPUS) -> Path:
    """The general-English corpus the model read (`pretrain.pinned_texts`: built from its pinned archives when
    missing, refused unless its texts are the pinned ones)."""
    pinned_texts(path)
    return path


# --- the same texts, clusters and folds as issue 61 -------------------------------------------------------


def _seed_words(line: dict[str, Any], fold: str) -> set[str]:
    return {s["word"] for s in line.get("datasets", {}).get(fold, {}).get("main", {}).get("seeds", [])}


def _main_figure(line: dict[str, Any], name: str) -> dict[str, Any]:
    return {f: ds.get("main", {}).get(name) for f, ds in sorted(line.get("datasets", {}).items())}


def _in_order(ours: Any, theirs: Any) -> dict[str, Any]:
    """Each fold's list in order: equal, the folds' lengths, and the first place they differ ([fold, index])."""
    ours, theirs = ours or [], theirs or []
    first = None
    for f in range(max(len(ours), len(theirs))):
        a = ours[f] if f < len(ours) else []
        b = theirs[f] if f < len(theirs) else []
        if a != b:
            first = [f, next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))]
            break
    return {"equal": first is None, "texts": [len(x) for x in ours], "issue_61_texts": [len(x) for x in theirs],
            "first_difference": first}


def same_task(ours: dict[str, Any], issue_61: dict[str, Any]) -> dict[str, Any]:
    """ENGLISH_SECTIONS.md's check, field by field, of this run's prepared line against issue 61's. Each field
    says what is checked (`check`), whether its values are `equal`, and whether it `passes`: equal where
    equality is required; both general-corpus checks found no near-duplicate; always, for the fields only
    reported (`datasets` rows and tokens) or differing by design (`model`, `base_hash`, the learning rate).
    `equal` (the whole check) holds when every field passes; `unequal` names those that do not."""
    ours, issue_61 = json.loads(json.dumps(ours)), json.loads(json.dumps(issue_61))  # as a results line holds them
    fields: dict[str, dict[str, Any]] = {}

    def required(name: str, a: Any, b: Any, show: bool = True) -> None:
        fields[name] = {"check": "equal", "equal": a == b, "passes": a == b,
                        **({"ours": a, "issue_61": b} if show else {})}

    def reported(name: str, a: Any, b: Any, why: str) -> None:
        fields[name] = {"check": why, "equal": a == b, "passes": True, "ours": a, "issue_61": b}

    for name in EQUAL_FIELDS:
        required(name, ours.get(name), issue_61.get(name))
    for name in IN_ORDER_FIELDS:
        fields[name] = {"check": "equal", **_in_order(ours.get(name), issue_61.get(name))}
        fields[name]["passes"] = fields[name]["equal"]
    for name in CLEANED_FOLDS:
        required(f"cleaning.{name}", ours.get("cleaning", {}).get(name), issue_61.get("cleaning", {}).get(name))
    for fold in sorted(set(ours.get("datasets", {})) | set(issue_61.get("datasets", {}))):
        a, b = _seed_words(ours, fold), _seed_words(issue_61, fold)
        fields[f"seeds.fold{fold}"] = {"check": "equal as sets of words", "equal": a == b, "passes": a == b,
                                       "words": len(a), "only_ours": sorted(a - b), "only_issue_61": sorted(b - a)}
    required("settings (but learning_rate)",
             {k: v for k, v in ours.get("settings", {}).items() if k != "learning_rate"},
             {k: v for k, v in issue_61.get("settings", {}).items() if k != "learning_rate"})
    required("versions (but maskstream)", {k: v for k, v in ours.get("versions", {}).items() if k != "maskstream"},
             {k: v for k, v in issue_61.get("versions", {}).items() if k != "maskstream"})
    general = [line.get("cleaning", {}).get("general") for line in (ours, issue_61)]
    fields["cleaning.general"] = {
        "check": "both say labeled_texts_with_a_near_duplicate 0 (the corpora differ by design)",
        "equal": general[0] == general[1], "ours": general[0], "issue_61": general[1],
        "passes": all(isinstance(g, dict) and g.get("labeled_texts_with_a_near_duplicate") == 0 for g in general)}
    reported("datasets.rows", _main_figure(ours, "rows"), _main_figure(issue_61, "rows"), "reported, not required")
    reported("datasets.tokens", _main_figure(ours, "tokens"), _main_figure(issue_61, "tokens"),
             "reported, not required")
    reported("model", ours.get("model"), issue_61.get("model"), "differs by design: the model under test")
    reported("base_hash", ours.get("base_hash"), issue_61.get("base_hash"),
             "differs by design: a hash of prepare's inputs, the model and corpora among them")
    reported("settings.learning_rate", ours.get("settings", {}).get("learning_rate"),
             issue_61.get("settings", {}).get("learning_rate"), "differs by design when LR is not 3e-4")
    unequal = [name for name, field in fields.items() if not field["passes"]]
    return {"equal": not unequal, "unequal": unequal, "fields": fields}


def prepared_line(config: EvaluateConfig) -> dict[str, Any]:
    """Prepare alone (as `evaluate` does it: one process prepares, another waits), and the prepared line
    `evaluate` will write into every phase's results.jsonl, as that file holds it."""
    # heavy: torch loads only when the run starts
    import torch

    torch.set_num_threads(config.threads)  # as evaluate sets it before preparing
    with claim(config.work / "prepare.lock", wait=True):
        evaluation = Evaluation(config, prepare(config))
    return json.loads(json.dumps(evaluation.prepared_line()))  # as results.jsonl holds it


# --- TAPT length and learning rate ----------------------------------------------------------------------


def fold_steps(rows: int, passes: float, batch_size: int = BATCH_SIZE) -> int:
    """The steps `evaluate --passes P` trains a fold whose `main` dataset holds `rows` rows: evaluate's own
    `Evaluation.tapt_steps`, called on a stand-in holding only what it reads (the config's steps and batch
    size, the fold's rows), so the rule is evaluate's, not a copy of it."""
    stand_in = SimpleNamespace(config=SimpleNamespace(steps=None, batch_size=batch_size),
                               prepared={"datasets": {"0": {"main": {"rows": rows}}}})
    return Evaluation.tapt_steps(stand_in, 0, passes)  # type: ignore[arg-type]


def round_half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


def seed_seconds(steps: float, a: float, b: float, p: float) -> float:
    """c(S): a seed, both trained arms, each fold a + b S seconds of TAPT and p of probe."""
    return TRAINED_ARMS * FOLDS * (a + b * steps + p)


def run_estimate(steps: float, seeds: int, D: float, a: float, b: float, p: float, n0: float) -> float:
    """E(S, N) = D + 2 n0 + (N + 2) c(S): the default pilot, two `none` lines (the pilot's and the
    confirmatory phase's), the pilot's 2 seeds and N confirmatory seeds."""
    return D + 2 * n0 + (seeds + len(PILOT_SEEDS)) * seed_seconds(steps, a, b, p)


def longest_affordable(D: float, a: float, b: float, p: float, n0: float, budget: float = BUDGET_SECONDS,
                       seeds: int = CAP_SEEDS) -> int | None:
    """S_max = floor(((budget - D - 2 n0) / 28 - a - p) / b), 28 = (N + 2) x 2 arms x 2 folds at N = 5: the
    most steps E(S, N) keeps within the budget (None when steps cost nothing, b <= 0)."""
    if b <= 0:
        return None
    return math.floor(((budget - D - 2 * n0) / ((seeds + len(PILOT_SEEDS)) * TRAINED_ARMS * FOLDS) - a - p) / b)


def tapt_plan(rows_per_fold: list[int], passes: float, learning_rate: float, D: float, a: float, b: float,
              p: float, n0: float, budget_seconds: float = BUDGET_SECONDS) -> dict[str, Any]:
    """ENGLISH_SECTIONS.md, "TAPT length and learning rate": the steps `evaluate --passes P` trains each fold
    (`fold_steps`), S = their mean rounded to the nearest integer, halves up; if E(S, 5) exceeds the budget,
    S is cut to S_max. Every figure tapt_plan.json holds."""
    steps_at_passes = [fold_steps(rows, passes) for rows in rows_per_fold]
    by_rule = round_half_up(Fraction(sum(steps_at_passes), len(steps_at_passes)))
    at_rule = run_estimate(by_rule, CAP_SEEDS, D, a, b, p, n0)
    most = longest_affordable(D, a, b, p, n0, budget_seconds)
    cut = at_rule > budget_seconds
    if cut and (most is None or most < 1):
        raise SystemExit(f"no TAPT length fits {budget_seconds:.0f} s at {CAP_SEEDS} seeds (E({by_rule}, "
                         f"{CAP_SEEDS}) = {at_rule:.0f} s, S_max {most})")
    steps = min(by_rule, most) if cut and most is not None else by_rule  # cut: E(S_max, 5) fits, E(S, 5) does not
    return {"passes": passes, "learning_rate": learning_rate, "batch_size": BATCH_SIZE, "rows": list(rows_per_fold),
            "steps_at_passes": steps_at_passes, "steps_by_rule": by_rule,
            "D": D, "a": a, "b": b, "p": p, "n0": n0, "budget_seconds": budget_seconds, "cap_seeds": CAP_SEEDS,
            "estimate_at_rule": at_rule, "steps_max": most, "cut": cut, "steps": steps,
            "seed_seconds": seed_seconds(steps, a, b, p),
            "estimate": run_estimate(steps, CAP_SEEDS, D, a, b, p, n0),
            "rule": "S = the mean over the folds of max(1, ceil(P x rows_f / 32)) (evaluate's Evaluation.tapt_steps), "
                    "rounded half up; E(S, N) = D + 2 n0 + (N + 2) x 2 arms x 2 folds x (a + b S + p); if E(S, 5) "
                    "exceeds 16 CPU-hours, S = floor(((57,600 - D - 2 n0) / 28 - a - p) / b)"}


def fit_tapt_seconds(steps: list[float], seconds: list[float]) -> dict[str, float]:
    """Least squares of a fold's TAPT seconds on its steps, seconds = a + b x steps, with a at least 0: where
    the free fit's intercept is negative, the best fit with a = 0 (through the origin)."""
    x, y = np.asarray(steps, dtype=float), np.asarray(seconds, dtype=float)
    if len(set(x.tolist())) < 2:
        raise SystemExit(f"the TAPT seconds' fit needs folds of two lengths or more; steps {sorted(set(x.tolist()))}")
    b, a = np.polyfit(x, y, 1)
    free = float(a)
    if a < 0:
        a, b = 0.0, float(x @ y / (x @ x))
    return {"a": float(a), "b": float(b), "free_intercept": free}


def default_pilot_figures(results_path: Path = DEFAULT_PILOT_RESULTS) -> dict[str, Any]:
    """What the default pilot's results.jsonl gives this run: D, the recorded TAPT + probe seconds of every arm
    line (`ours.run_seconds`); a and b, the fit of each `random` line's folds' `seconds.tapt` on their
    `pretraining.steps`; the chosen cell (its passes P and learning rate LR: refused until every cell is in);
    and the model of every prepared line."""
    found = gains(results_path, DEFAULT_MLM_PILOT)
    made = chosen(found, DEFAULT_MLM_PILOT)
    if made is None:
        raise SystemExit(f"{results_path}: {len(found)} of {len(DEFAULT_MLM_PILOT.grid)} cells of the default pilot "
                         "are in; its chosen cell fixes P and LR")
    cell = {"number": made.cell.number, "rule": made.rule, "verdict": made.verdict, "passes": made.cell.passes,
            "learning_rate": made.cell.learning_rate}
    kinds = load(results_path)  # the last line of each (config, arm, seed)
    arms = kinds["arm"]
    folds = [f for r in arms if r["arm"] == "random" for f in r["folds"]]
    if len(folds) != len(DEFAULT_MLM_PILOT.grid) * FOLDS:  # ENGLISH_SECTIONS.md: the 16 folds of its 8 random lines
        raise SystemExit(f"{results_path}: {len(folds)} TAPT folds of `random` lines, the fit needs "
                         f"{len(DEFAULT_MLM_PILOT.grid) * FOLDS}")
    # a resumed fold timed only the steps after its resume
    timed = [f["pretraining"]["steps"] - (f["pretraining"].get("resumed_from_step") or 0) for f in folds]
    fit = fit_tapt_seconds(timed, [f["seconds"]["tapt"] for f in folds])
    return {"D": sum(run_seconds(r) for r in arms), "arm_lines": len(arms),
            "random_lines": sum(1 for r in arms if r["arm"] == "random"), "fit_folds": len(folds), **fit,
            "cell": cell, "models": {p["base_hash"]: p["model"] for p in kinds["prepared"]}}


# --- the pilot, and N -----------------------------------------------------------------------------------


def seed_budget(needed: int | None, D: float, spent: float, none: float, per_seed: float,
                budget: float = BUDGET_SECONDS) -> dict[str, Any]:
    """N_afford = floor((budget - D - L - n) / c), with L the pilot's recorded seconds, n its `none` line's (run
    again) and c its seconds a seed; N = max(5, min(N_power, N_afford, 24)), the floor of 5 standing over the
    budget: the estimated cost D + L + n + N c, whether it fits and by how much it overruns."""
    affordable = max(0, math.floor((budget - D - spent - none) / per_seed))
    seeds = max(MIN_SEEDS, min(needed if needed is not None else MAX_SEEDS, affordable, MAX_SEEDS))
    estimated = D + spent + none + seeds * per_seed
    return {"default_pilot_seconds": D, "pilot_seconds": spent, "none_seconds": none, "seconds_per_seed": per_seed,
            "budget_seconds": budget, "affordable_seeds": affordable, "seeds": seeds,
            "estimated_seconds": estimated, "fits_budget": estimated <= budget,
            "overrun_seconds": max(0.0, estimated - budget)}


def seed_plan(pilot: Path, D: float) -> dict[str, Any]:
    """ENGLISH_SECTIONS.md's rule: N_power by `sections_run.seed_plan` (the crossed bootstrap's components of
    the pilot's `difference − random`, the seeds' parts scaled by n/(n - 1)); N_afford from 16 CPU-hours less D
    and the pilot's measured cost (`seed_budget`; sections_run's own budget fields, 12 CPU-hours without D, are
    not used); the power N leaves."""
    power = sections_seed_plan(pilot)  # refuses a file of more than one evaluation; measures the pilot's cost
    budget = seed_budget(power["seeds_for_power"], D, power["pilot_seconds"], power["none_seconds"],
                         power["seconds_per_seed"])
    n, texts = len(power["pilot_seeds"]), power["texts"]
    kept = ("pilot_seeds", "texts", "bootstrap_components", "components", "pilot_difference", "seeds_for_power")
    return {**{k: power[k] for k in kept}, **budget,
            "power_at_margin": hierarchical_power(EFFECT, projected_variance(power["components"], n, texts,
                                                                             budget["seeds"], texts)),
            "rule": "N = the seeds at which the hierarchical standard error (the pilot's texts, seeds and seed x "
                    "text components, the last two scaled by n/(n-1)) gives 80 % power at +-1 point with every "
                    "labeled text, at least 5 (even over the budget), at most what 16 CPU-hours less the default "
                    "pilot's cost (D), this pilot's cost and a second `none` afford at the pilot's cost a seed "
                    "(and 24)"}


# --- the run --------------------------------------------------------------------------------------------


def run(root: Path) -> None:
    if MODEL_IDENTITY is None:
        check_model(MODEL_IDENTITY)  # refuses, saying why
    root = root / "sections-english"
    check_frozen()  # every package from this clone, not the checkout the venv was installed from
    check_versions(root, PHASES)
    check_task()
    if not DEFAULT_PILOT_RESULTS.exists():
        raise SystemExit(f"{DEFAULT_PILOT_RESULTS} is missing: the default pilot's results fix P, LR, D, a and b")
    check_model(MODEL_IDENTITY, {f"the default pilot's prepared line {p['base_hash']}": p["model"]
                                 for p in load(DEFAULT_PILOT_RESULTS)["prepared"]})
    corpus = general_corpus()
    plan_path, same_path = root / "tapt_plan.json", root / "same_task.json"
    plan = json.loads(plan_path.read_text(encoding="utf-8")) if plan_path.exists() else None
    figures = None
    if plan is None:
        figures = default_pilot_figures(DEFAULT_PILOT_RESULTS)
        passes, learning_rate = figures["cell"]["passes"], figures["cell"]["learning_rate"]
    else:
        passes, learning_rate = plan["passes"], plan["learning_rate"]
    base = {"labeled": str(REPO / SECTIONS_TASK["path"]), "model": default_mlm(), "general_corpus": [str(corpus)],
            "work": cache_root() / "evaluate-sections-english"}
    # prepare's key holds neither steps nor passes (EvaluateConfig.deciding()): this is the run's prepare
    config = EvaluateConfig(output=root / "pilot", seeds=PILOT_SEEDS, **base,
                            **{**SECTIONS_SETTINGS, "steps": None, "passes": (passes,), "learning_rate": learning_rate})
    line = prepared_line(config)
    check_model(MODEL_IDENTITY, {"this run's prepared line": line["model"]})
    with ISSUE_61.open(encoding="utf-8") as f:
        issue_61 = json.loads(f.readline())  # the first line only: the file holds every line's predictions
    if issue_61["kind"] != "prepared":
        raise SystemExit(f"{ISSUE_61}: its first line is not issue 61's prepared line")
    same = same_task(line, issue_61)
    if not same["equal"]:
        same_path.parent.mkdir(parents=True, exist_ok=True)
        same_path.write_text(json.dumps(same, indent=1) + "\n", encoding="utf-8")
        commit(root, [same_path], f"evaluate (issue 76): not issue 61's texts, clusters and folds "
                                  f"({', '.join(same['unequal'])} differ); the run stops")
        raise SystemExit(f"not issue 61's texts, clusters and folds: {', '.join(same['unequal'])} differ "
                         f"({same_path})")
    rows = [line["datasets"][str(f)]["main"]["rows"] for f in range(FOLDS)]
    if plan is None:
        assert figures is not None
        plan = {**tapt_plan(rows, passes, learning_rate, figures["D"], figures["a"], figures["b"], PROBE_SECONDS,
                            NONE_SECONDS),
                "default_pilot": {k: figures[k] for k in ("cell", "arm_lines", "random_lines", "fit_folds",
                                                          "free_intercept")}}
        root.mkdir(parents=True, exist_ok=True)
        same_path.write_text(json.dumps(same, indent=1) + "\n", encoding="utf-8")
        plan_path.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
        commit(root, [same_path, plan_path],
               f"evaluate (issue 76): issue 61's texts, clusters and folds; the TAPT plan, {plan['steps']} steps "
               f"at learning rate {learning_rate:g} ({passes:g} passes"
               + (f", cut from {plan['steps_by_rule']}" if plan["cut"] else "") + ")")
    elif plan["rows"] != rows:
        raise SystemExit(f"{plan_path} was made from rows {plan['rows']}, this prepare gives {rows}")
    common = {**base, **SECTIONS_SETTINGS, "steps": plan["steps"], "learning_rate": plan["learning_rate"]}
    while not phase(root, "pilot", PILOT_SEEDS, common, planned=None, issue="issue 76"):
        time.sleep(60)  # another process holds the last pilot runs: the plan needs them all
    seeds_path = root / "seed_plan.json"
    if not seeds_path.exists():
        seeds = seed_plan(root / "pilot", plan["D"])
        seeds_path.write_text(json.dumps(seeds, indent=1) + "\n", encoding="utf-8")
        commit(root, [seeds_path], f"evaluate (issue 76): the seed plan, {seeds['seeds']} confirmatory seeds "
                                   f"(power {seeds['power_at_margin']:.2f} at +-1 point"
                                   + ("" if seeds["fits_budget"] else
                                      f", {seeds['overrun_seconds']:.0f} s over the budget") + ")")
    seeds = json.loads(seeds_path.read_text(encoding="utf-8"))
    if not seeds["fits_budget"] and not (root / "README.md").exists():
        raise SystemExit(f"{seeds['seeds']} seeds overrun the budget by {seeds['overrun_seconds']:.0f} s: the "
                         f"results' README says so before the first confirmatory line (ENGLISH_SECTIONS.md); "
                         f"commit {root / 'README.md'}, then run again")
    phase(root, "confirmatory", tuple(range(seeds["seeds"])), common, planned=seeds["seeds"], issue="issue 76")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-root", type=Path, default=RESULTS,
                        help="where RESULTS/sections-english/ is written and committed (default: this checkout's)")
    args = parser.parse_args(argv)
    run(args.results_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())

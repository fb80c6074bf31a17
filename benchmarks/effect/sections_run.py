"""Issue 61's run of `maskstream evaluate`, as SECTIONS.md fixes it: 27,513 labeled Debian descriptions
(25 sections), the `sections` general model (pretrained on the other half of the archive), TAPT of a fixed
number of steps, a pilot that sizes the run, then the confirmatory seeds.

    python -m benchmarks.effect.sections_run --results-root RESULTS   # twice, side by side: they share the work

Phases, each finished (arm, seed) committed with its report (`git commit --only`), so a fresh clone
continues where a session stopped:
1. the `sections` general model: found in models/KEY, else trained (`python -m benchmarks.effect.ours general
   --config sections` trains it alone);
2. `pilot` (seeds PILOT_SEEDS, results in RESULTS/sections/pilot/): its text and seed variance and its cost
   fix N, written to RESULTS/sections/seed_plan.json and committed before the first confirmatory run;
3. `confirmatory` (seeds 0 .. N - 1, RESULTS/sections/confirmatory/): the decision, read once all N are in.

Run it from a clone of SECTIONS.md's last commit, its packages linked into the clone's maskstream/ (it checks
them) and the general model's folder copied in, with --results-root pointing at the checkout where the
results are committed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.effect.configs import SECTIONS_GENERAL_CORPUS, SECTIONS_TASK
from benchmarks.effect.ours import REPO, check_versions, commit, general_model, phase, run_seconds
from benchmarks.effect.pilot import check_frozen
from maskstream.evaluate.report import compare, load
from maskstream.evaluate.statistics import design_for_power, hierarchical_power, projected_variance
from maskstream.pipelines.dataset.core.tokenizer_facts import cache_root

# SECTIONS.md: what decides the run, fixed before it starts
SETTINGS = {"label_field": SECTIONS_TASK["label_field"], "arms": ("none", "random", "difference"), "steps": 1350,
            "batch_size": 32, "learning_rate": 3e-4, "max_length": 128, "folds": 2, "probe_folds": 5,
            "margin": 0.01, "threads": 1, "device": "cpu"}
PILOT_SEEDS = (2000, 2001)  # their variance and cost fix N; they are not part of the test
EFFECT, MIN_SEEDS, MAX_SEEDS = 0.01, 5, 24
BUDGET_SECONDS = 12 * 3600  # the whole run, pilot included, in seconds of one core (one thread a process)
RESAMPLES = 2000
PHASES = ("pilot", "confirmatory")


def seed_plan(pilot: Path) -> dict[str, Any]:
    """SECTIONS.md's rule. From the pilot's `difference − random`: the crossed bootstrap's variance components
    (texts, seeds, seed x text) give the seeds at which the hierarchical standard error has 80 % power at
    ±1 point with all the labeled texts; the pilot's measured cost gives the seeds the budget affords (both
    arms a seed). N = that need, at least MIN_SEEDS, at most what the budget affords (and MAX_SEEDS); the
    power N leaves is said.

    The bootstrap over n seeds draws with replacement, so its seed variance is (n - 1)/n of the unbiased
    one (half of it with the pilot's 2 seeds): the seeds and seed x text components are scaled by n/(n - 1)
    before they are projected."""
    kinds = load(pilot / "results.jsonl")
    if len(kinds["prepared"]) != 1:
        raise SystemExit(f"{pilot}: {len(kinds['prepared'])} prepared evaluations; the plan needs one")
    [prepared] = kinds["prepared"]
    lines = [r for r in kinds["arm"] if r.get("base_hash") == prepared["base_hash"]]
    pilot_seeds = sorted({r["seed"] for r in lines if r["arm"] in ("difference", "random")})
    if len({r["config_hash"] for r in lines if r["arm"] != "none"}) != 1:
        raise SystemExit(f"{pilot}: lines of more than one evaluation; the plan needs one")
    comparison = compare(prepared, lines, "difference", "random", EFFECT, RESAMPLES)
    boot = comparison["bootstrap"]
    texts, n = boot["texts_judged"], boot["n"]
    components = {**boot["components"], "seeds": boot["components"]["seeds"] * n / (n - 1),
                  "seed_x_text": boot["components"]["seed_x_text"] * n / (n - 1)}
    needed = design_for_power(components, n, texts, EFFECT)["seeds"]
    spent = sum(run_seconds(r) for r in lines)
    none = sum(run_seconds(r) for r in lines if r["arm"] == "none")  # the confirmatory phase runs it again
    per_seed = sum(run_seconds(r) for r in lines if r["arm"] != "none") / len(pilot_seeds)  # both arms
    affordable = max(0, math.floor((BUDGET_SECONDS - spent - none) / per_seed))
    seeds = max(MIN_SEEDS, min(needed if needed is not None else MAX_SEEDS, affordable, MAX_SEEDS))
    return {"pilot_seeds": pilot_seeds, "texts": texts, "bootstrap_components": boot["components"],
            "components": components,
            "pilot_difference": boot["mean"], "seeds_for_power": needed,
            "pilot_seconds": spent, "none_seconds": none, "seconds_per_seed": per_seed,
            "budget_seconds": BUDGET_SECONDS,
            "affordable_seeds": affordable, "seeds": seeds,
            "power_at_margin": hierarchical_power(EFFECT, projected_variance(components, n, texts, seeds, texts)),
            "estimated_seconds": spent + none + seeds * per_seed,
            "rule": "N = the seeds at which the hierarchical standard error (the pilot's texts, seeds and seed x "
                    "text components, the last two scaled by n/(n-1)) gives 80 % power at +-1 point with every labeled text, at least 5, at most "
                    "what 12 CPU-hours less the pilot's cost (and a second `none`) afford at the pilot's cost a seed "
                    "(and 24)"}


def run(root: Path) -> None:
    root = root / "sections"
    check_frozen()  # every package from this clone, not the checkout the venv was installed from
    check_versions(root, PHASES)
    common = {"labeled": str(REPO / SECTIONS_TASK["path"]), "model": str(general_model("sections")),
              "general_corpus": [str(REPO / SECTIONS_GENERAL_CORPUS["path"])],
              "work": cache_root() / "evaluate-sections", **SETTINGS}
    while not phase(root, "pilot", PILOT_SEEDS, common, planned=None, issue="issue 61"):
        time.sleep(60)  # another process holds the last pilot runs: the plan needs them all
    plan_path = root / "seed_plan.json"
    if not plan_path.exists():
        plan = seed_plan(root / "pilot")
        plan_path.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
        commit(root, [plan_path], f"evaluate (issue 61): the seed plan, {plan['seeds']} confirmatory seeds "
                                  f"(power {plan['power_at_margin']:.2f} at +-1 point)")
    plan = json.loads(plan_path.read_text(encoding="utf-8"))
    phase(root, "confirmatory", tuple(range(plan["seeds"])), common, planned=plan["seeds"], issue="issue 61")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-root", type=Path, default=REPO / "benchmarks" / "effect" / "results",
                        help="where RESULTS/sections/ is written and committed (default: this checkout's)")
    args = parser.parse_args(argv)
    run(args.results_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())

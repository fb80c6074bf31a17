"""REPORT.md and differences-CONFIG.png of an evaluation, generated from its results.jsonl alone.

Lines are grouped by config hash (the inputs, the settings, the model, the arms' datasets and the TAPT
passes), so later runs add seeds to their evaluation. Each section below is one function, in the
order the report shows them.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from maskstream.evaluate.design import (
    ARMS,
    BASELINE,
    CONTROL,
    MIN_DECISION_SEEDS,
    PRIMARY,
    PRIMARY_METRIC,
    RESAMPLES,
)
from maskstream.evaluate.statistics import (
    ALPHA,
    crossed_bootstrap,
    design_for_power,
    hierarchical_power,
    holm,
    paired_summary,
    tost,
)

SCOPE = ("**What the intervals cover.** Seeds (each seed draws its own TAPT data order and masks) and texts (the "
         "labeled texts, resampled by near-duplicate cluster) for **one** model and **one** task. Neither covers "
         "another model, another task or another corpus.")


def pts(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:+.2f}"


def ci(pair: list[float]) -> str:
    return "–" if math.isnan(pair[0]) else f"[{100 * pair[0]:+.2f}, {100 * pair[1]:+.2f}]"


def num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def with_error(x: float, error: float) -> str:
    """`x ± error`, the error to one significant digit and `x` to the same place (at most 3 decimals): the
    digits a Monte Carlo estimate supports."""
    if math.isnan(x):
        return "–"
    if math.isnan(error) or error <= 0:
        return f"{x:.2f}"
    digits = min(3, max(0, -math.floor(math.log10(error))))
    return f"{x:.{digits}f} ± {error:.{digits}f}"


def load(results: Path) -> dict[str, list[dict[str, Any]]]:
    """kind -> lines; of `arm` and `pilot` lines, the last of each (config hash, arm, seed)."""
    kinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    last: dict[tuple, dict[str, Any]] = {}
    for text in results.read_text(encoding="utf-8").splitlines():
        if text.strip():
            line = json.loads(text)
            if line["kind"] in ("arm", "pilot"):
                last[line["kind"], line["config_hash"], line["arm"], line["seed"]] = line
            elif line["kind"] == "prepared":  # two processes starting together may both have written it
                last["prepared", line["base_hash"], None, None] = line
            else:
                kinds[line["kind"]].append(line)
    for (kind, *_), line in last.items():
        kinds[kind].append(line)
    return kinds


def coded(prepared: dict[str, Any], lines: list[dict[str, Any]]) -> tuple[list[np.ndarray], list[np.ndarray],
                                                                         dict[str, dict[Any, list[np.ndarray]]]]:
    """(truth per fold, clusters per fold, arm -> seed -> predictions per fold), labels as integers."""
    codes = {label: i for i, label in enumerate(prepared["labels"])}
    truth = [np.array([codes[y] for y in fold]) for fold in prepared["truth"]]
    clusters = [np.array(fold) for fold in prepared["cluster_ids"]]
    predictions: dict[str, dict[Any, list[np.ndarray]]] = defaultdict(dict)
    for r in lines:
        predictions[r["arm"]][r["seed"]] = [np.array([codes.get(p, len(codes)) for p in f["predictions"]])
                                            for f in sorted(r["folds"], key=lambda f: f["fold"])]
    return truth, clusters, predictions


def compare(prepared: dict[str, Any], lines: list[dict[str, Any]], arm: str, base: str, margin: float,
            resamples: int) -> dict[str, Any]:
    """Paired statistics of arm - base over the seeds both have (`none`, seedless, pairs with every seed)."""
    def scores(name: str) -> dict[Any, float]:
        return {r["seed"]: r[PRIMARY_METRIC] for r in lines if r["arm"] == name}

    a, b = scores(arm), scores(base)
    truth, clusters, predictions = coded(prepared, lines)
    pa, pb = predictions[arm], predictions[base]
    if None in b:  # `none` has one run: it pairs with every seed of the arm
        b = {s: b[None] for s in a}
        pb = {s: pb[None] for s in pa}
    summary = paired_summary(a, b)
    summary["tost"] = tost(summary["differences"], margin)
    boot = summary["bootstrap"] = crossed_bootstrap(truth, clusters, pa, pb, resamples)
    # Power and the design a decision needs count texts and seeds: the hierarchical standard error.
    if boot["n"]:
        summary["power_at_margin"] = hierarchical_power(margin, boot["hierarchical"]["sd"] ** 2)
        summary["for_power"] = design_for_power(boot["components"], boot["n"], boot["texts_judged"], margin)
    else:
        summary["power_at_margin"], summary["for_power"] = math.nan, {"seeds": None, "texts": None}
    summary["log_probability"] = log_probability_difference(prepared, lines, arm, base)
    return summary


def log_probability_difference(prepared: dict[str, Any], lines: list[dict[str, Any]], arm: str, base: str
                               ) -> float | None:
    """The mean over paired seeds and every text of log p(true label) of `arm` minus `base`'s: a continuous
    per-text outcome, from the probe's stored class probabilities (None for results without them)."""
    def true_log_probability(line: dict[str, Any]) -> np.ndarray | None:
        parts = []
        for fold in sorted(line["folds"], key=lambda f: f["fold"]):
            stored = fold.get("probabilities")
            if stored is None:
                return None
            column = {label: i for i, label in enumerate(stored["labels"])}
            values = np.asarray(stored["values"], dtype=np.float64)
            truth = [column.get(y) for y in prepared["truth"][fold["fold"]]]
            parts.append(np.log(np.clip([values[i, c] if c is not None else 0.0 for i, c in enumerate(truth)],
                                        1e-12, 1.0)))
        return np.concatenate(parts)

    runs = {name: {r["seed"]: true_log_probability(r) for r in lines if r["arm"] == name} for name in (arm, base)}
    if None in runs[base]:  # `none` pairs with every seed
        runs[base] = {s: runs[base][None] for s in runs[arm]}
    gaps = [runs[arm][s] - runs[base][s] for s in sorted(set(runs[arm]) & set(runs[base]))
            if runs[arm][s] is not None and runs[base][s] is not None]
    return float(np.mean([g.mean() for g in gaps])) if gaps else None


def decision(primary: dict[str, Any], control: dict[str, Any] | None, margin: float, planned: int) -> str:
    """The decision sentence (docs/evidence.md). Below MIN_DECISION_SEEDS seeds, or without a passing
    control, none: an exploratory line. Superiority needs the paired t-test and the hierarchical interval on
    the same side of zero as the mean; equivalence needs TOST and the hierarchical 90 % interval inside the
    margin. Before the planned seeds are in, no decision."""
    h = primary["bootstrap"]["hierarchical"]
    mean, n, points = primary["mean"], primary["n"], 100 * margin
    found = f"difference − random {pts(mean)} {ci(h['ci'])}"
    if n < MIN_DECISION_SEEDS:
        return (f"Exploratory, no decision: {n} seeds, and a decision needs {MIN_DECISION_SEEDS} or more "
                f"(with {n} the bootstrap over seeds understates their spread: the t-interval over seeds is "
                f"{ci(primary['ci'])}). {found.capitalize()}.")
    if not control_passes(control):
        return (f"Exploratory, no decision: the control (random − none) {'was not run' if control is None else 'did not pass'}"
                f", so this setup has not shown that it can see a masking effect. {found.capitalize()}.")
    if n < planned:
        return f"Undecided at {n} of {planned} seeds (interim): {found}."
    text = f"{100 * abs(mean):.2f} points {ci(h['ci'])} (probe macro-F1, every labeled text, {n} seeds)"
    if primary["p_t"] < ALPHA and h["ci"][0] > 0 and mean > 0:
        return f"Difference masking beats random masking by {text}."
    if primary["p_t"] < ALPHA and h["ci"][1] < 0 and mean < 0:
        return f"Random masking beats difference masking by {text}."
    if primary["tost"]["p"] < ALPHA and -margin < h["ci90"][0] and h["ci90"][1] < margin:
        return (f"Difference masking is within ±{points:g} point of random masking: {pts(mean)} "
                f"{ci(h['ci'])} ({n} seeds).")
    return f"Undecided at {n} seeds: {found}."


def one_sided(comparison: dict[str, Any], margin: float) -> str:
    """What the hierarchical interval rules out on each side, and the bootstrap's P(difference > 0)."""
    h = comparison["bootstrap"]["hierarchical"]
    points = f"{100 * margin:g} point{'s' if margin != 0.01 else ''}"
    ruled = [f"a gain of {points} or more" if h["ci"][1] < margin else None,
             f"a loss of {points} or more" if h["ci"][0] > -margin else None]
    ruled = [r for r in ruled if r]
    text = f"ruled out by the hierarchical 95 % interval: {' and '.join(ruled)}" if ruled else (
        f"neither a gain nor a loss of {points} is ruled out")
    return f"{text}; P(difference − random > 0) in the bootstrap: {num(h.get('p_positive'), 2)}"


def section_design(prepared: dict[str, Any], selections: list[dict[str, Any]], pilot: dict[str, Any] | None,
                   lines: list[dict[str, Any]]) -> list[str]:
    labeled, clusters = prepared["labeled"], prepared["clusters"]
    settings = prepared["settings"]
    out = ["## Design", "",
           f"- Labeled texts: {labeled['read']} read from `{labeled['file']}`, {labeled['kept']} kept, "
           f"{labeled['rejected']} rejected (WORK/rejects.jsonl says why); {clusters['count']} near-duplicate "
           f"clusters (largest {clusters['largest']}, {clusters['texts_in_clusters_of_2_or_more']} texts in clusters "
           "of two or more).",
           f"- {settings['folds']} folds by cluster, stratified by label: "
           + "; ".join(f"fold {f}: " + ", ".join(f"{y} {n}" for y, n in c.items())
                       for f, c in prepared["counts"].items()) + ".",
           f"- Model: `{prepared['model'].get('name')}`" + (f" (sha256 of its weights and config {prepared['model']['sha256'][:16]}…)"
                                                          if "sha256" in prepared["model"] else "") + ".",
           f"- TAPT: {settings['batch_size']} x {settings['max_length']} tokens, learning rate "
           f"{settings['learning_rate']:g}, the same steps, data order and learning rate for every arm of a seed and fold.",
           f"- Probe: out of fold ({settings['probe_folds']} cluster folds) on each fold's texts; C per fold "
           + ", ".join(f"fold {s['fold']}: {s['chosen_C']:g}" for s in sorted(selections, key=lambda s: s["fold"]))
           + " (chosen on `none`).", "", "| corpus | rows | near-duplicates of judged texts removed | kept |",
           "| --- | ---: | ---: | ---: |"]
    for name, c in prepared["cleaning"].items():
        out.append(f"| {name} | {c['rows']} | {c.get('removed', c.get('labeled_texts_with_a_near_duplicate', '–'))} | "
                   f"{c.get('kept', c['rows'])} |" if isinstance(c, dict) else f"| {name} | {c} | | |")
    leaks = prepared["leaks_after_cleaning"]
    out += ["", f"Checked again after cleaning by comparing every pair (not the join that cleaned): "
            f"{sum(leaks.values())} texts of the corpora the arms read near-duplicate a judged text."]
    if pilot:
        out += ["", f"Pilot: {pilot['passes']:g} TAPT passes chosen (gains of random over none: "
                + ", ".join(f"{k}: {pts(v)}" for k, v in pilot["gains"].items()) + ")."]
    passes = {r["passes"] for r in lines if r["arm"] != "none" and r["passes"] is not None}
    steps = {f["pretraining"]["steps"] for r in lines if r["arm"] != "none" and r["passes"] is None for f in r["folds"]}
    out += ["", f"TAPT passes: {', '.join(f'{p:g}' for p in sorted(passes)) or '–'}."
            + (f" TAPT steps a fold (--steps): {', '.join(map(str, sorted(steps)))}." if steps else "")]
    return out


def section_scores(lines: list[dict[str, Any]]) -> list[str]:
    out = ["## Scores", "", "| arm | seeds | macro-F1 (mean over seeds) | sd | per fold |", "| --- | ---: | ---: | ---: | --- |"]
    for arm in [a for a in ARMS if any(r["arm"] == a for r in lines)]:
        values = [r[PRIMARY_METRIC] for r in lines if r["arm"] == arm]
        folds = defaultdict(list)
        for r in lines:
            if r["arm"] == arm:
                for f in r["folds"]:
                    folds[f["fold"]].append(f[PRIMARY_METRIC])
        sd = float(np.std(values, ddof=1)) if len(values) > 1 else math.nan
        out.append(f"| `{arm}` | {len(values) if arm != 'none' else '– (no seed)'} | {100 * np.mean(values):.2f} | "
                   f"{num(100 * sd if not math.isnan(sd) else sd, 2)} | "
                   + ", ".join(f"{f}: {100 * np.mean(v):.2f}" for f, v in sorted(folds.items())) + " |")
    return out


def section_comparisons(prepared: dict[str, Any], lines: list[dict[str, Any]], margin: float, resamples: int,
                        planned: int | None) -> tuple[list[str], dict[str, Any] | None]:
    arms = {r["arm"] for r in lines}
    pairs = [(a, BASELINE) for a in ARMS if a in arms and a not in (BASELINE, "none")]
    if CONTROL[1] in arms:
        pairs.append(CONTROL)
    results = {pair: compare(prepared, lines, *pair, margin, resamples) for pair in pairs}
    exploratory = {f"{a} − {b}": r["p_t"] for (a, b), r in results.items() if (a, b) not in (PRIMARY, CONTROL)}
    adjusted = holm(exploratory)
    out = ["## Comparisons", "", SCOPE, "",
           "| comparison | role | n | mean | hierarchical 95 % CI | P(> 0) | seeds-only CI | texts-only CI | variance "
           f"shares ± Monte Carlo error: texts / seeds / seed × text | p (paired t) | TOST p (±{100 * margin:g}) | power at "
           f"±{100 * margin:g} | for 80 % power: seeds (these texts) / texts (these seeds) |",
           "| --- | --- | ---: | ---: | --- | ---: | --- | --- | --- | ---: | ---: | ---: | --- |"]
    for (a, b), r in results.items():
        name = f"{a} − {b}"
        role = "primary" if (a, b) == PRIMARY else "control" if (a, b) == CONTROL else (
            f"exploratory (Holm p {num(adjusted[name])})")
        boot = r["bootstrap"]
        if boot["n"] == 0:
            continue
        need = r["for_power"]
        shares = " / ".join(with_error(boot["share"][k], boot["share_mc_error"][k]) for k in ("texts", "seeds", "seed_x_text"))
        texts_needed = f"{need['texts']:,}" if need["texts"] else "none reaches it"
        out.append(f"| `{name}` | {role} | {r['n']} | {pts(r['mean'])} | {ci(boot['hierarchical']['ci'])} | "
                   f"{num(boot['hierarchical'].get('p_positive'), 2)} | {ci(boot['seeds']['ci'])} | "
                   f"{ci(boot['texts']['ci'])} | {shares} | {num(r['p_t'])} | {num(r['tost']['p'])} | "
                   f"{num(r['power_at_margin'], 2)} | {need['seeds'] or 'none reaches it'} / {texts_needed} |")
    primary = results.get(PRIMARY)
    if primary and primary["bootstrap"]["n"] and planned is not None:
        out += ["", "**Decision:** " + decision(primary, results.get(CONTROL), margin, planned),
                "", f"Difference − random{'' if decides(primary, results.get(CONTROL)) else ' (exploratory)'}: "
                f"{one_sided(primary, margin)}."]
    out += ["", control_line(results.get(CONTROL), arms)]
    log_probability = [(name, r["log_probability"]) for (a, b), r in results.items()
                       for name in [f"{a} − {b}"] if r["log_probability"] is not None]
    if log_probability:
        out += ["", "True label's log-probability under the probe, mean over texts and paired seeds: "
                + "; ".join(f"`{name}` {value:+.4f}" for name, value in log_probability) + "."]
    return out, primary


def decides(primary: dict[str, Any], control: dict[str, Any] | None) -> bool:
    """Enough seeds and a passing control: only then may the report say more than what it found."""
    return primary["n"] >= MIN_DECISION_SEEDS and control_passes(control)


def control_passes(control: dict[str, Any] | None) -> bool:
    """TAPT with random masking beats no TAPT: the hierarchical interval of random − none above zero."""
    return control is not None and control["bootstrap"]["hierarchical"]["ci"][0] > 0


def control_line(control: dict[str, Any] | None, arms: set[str]) -> str:
    """The control's line, whatever the arms and the seeds: passed, failed or not run."""
    if control is None or not control["bootstrap"]["n"]:
        missing = " and ".join(f"`{a}`" for a in CONTROL if a not in arms) or "its seeds"
        return (f"**No control:** random − none needs the arms `random` and `none` ({missing} missing here), so "
                "this setup has not shown that it can detect a masking strategy's effect.")
    h = control["bootstrap"]["hierarchical"]["ci"]
    if control_passes(control):
        return f"**The control passes:** random − none {pts(control['mean'])} {ci(h)} ({control['n']} seeds)."
    failed = f"**The control does not pass:** random − none {pts(control['mean'])} {ci(h)} ({control['n']} seeds). "
    seeds_only = control["bootstrap"].get("seeds", {}).get("ci")
    share = control["bootstrap"].get("share", {}).get("texts")
    if seeds_only and seeds_only[0] > 0 and share is not None:
        # issue 74's shipped default run: a gain clear of the seeds' spread, and the judged texts' draw spans zero
        return failed + (f"On these texts TAPT with random masking gained beyond the seeds' spread (seeds-only "
                         f"interval {ci(seeds_only)}), but which texts were judged moves the comparison more (the "
                         f"texts' share of its variance: {share:.2f}): more seeds will not narrow the interval, more "
                         "labeled texts will (the table's last column). Until the control passes, a difference "
                         "between arms is not read as a masking strategy's effect.")
    return failed + ("TAPT with random masking did not beat no TAPT on this readout, so this setup has not shown that "
                     "it can detect a masking strategy's effect: a difference between arms may be how much each one's "
                     "TAPT moved the model, not how well it masks. A --model whose masked-LM head was never trained (a "
                     "sentence encoder such as the offline MiniLM) failed this control at every setting of issue 60's "
                     "pilot, more --passes included (docs/evidence.md); the default model's head is trained.")


def plot(primary: dict[str, Any] | None, path: Path) -> bool:
    """The per-seed paired differences of the primary comparison, with their mean and hierarchical interval."""
    if not primary or primary["n"] == 0:
        return False
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib.pyplot as plt

    diffs = 100 * np.array(primary["differences"])
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.axhline(0, color="grey", lw=0.8)
    ax.scatter(range(len(diffs)), diffs, s=18, label="seed")
    low, high = (100 * v for v in primary["bootstrap"]["hierarchical"]["ci"])
    ax.axhspan(low, high, color="tab:orange", alpha=0.2, label="hierarchical 95 % CI")
    ax.axhline(100 * primary["mean"], color="tab:orange", label=f"mean {100 * primary['mean']:+.2f}")
    ax.set_xticks(range(len(diffs)), [str(s) for s in primary["seeds"]], fontsize=7)
    ax.set_xlabel("seed")
    ax.set_ylabel("difference − random, macro-F1 points")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(results: Path, report: Path, margin: float = 0.01, planned: int | None = None,
                 resamples: int = RESAMPLES) -> None:
    """REPORT.md (and differences-CONFIG.png beside it) of every evaluation in `results`. With `planned`
    seeds, the decision line (interim while fewer are in); without, no decision (e.g. variance seeds)."""
    kinds = load(results)
    sections = ["# Does difference masking beat random masking?", "",
                f"Generated from `{results.name}` by `maskstream evaluate --report-only`; nothing here is written by "
                "hand. Design and rules: docs/evidence.md.", ""]
    for prepared in kinds["prepared"]:
        base = prepared["base_hash"]
        by_config: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in kinds["arm"]:
            if r["base_hash"] == base:
                by_config[r["config_hash"]].append(r)
        none = [r for r in kinds["arm"] if r["base_hash"] == base and r["arm"] == "none"]
        selections = [s for s in kinds["probe_selection"] if s["base_hash"] == base]
        pilot = next((p for p in kinds["pilot_choice"] if p["base_hash"] == base), None)
        for chash, lines in by_config.items():
            if all(r["arm"] == "none" for r in lines):
                continue
            lines = lines + [r for r in none if r not in lines]
            sections += [f"## Evaluation {chash}", ""]
            sections += section_design(prepared, selections, pilot, lines) + [""]
            sections += section_scores(lines) + [""]
            table, primary = section_comparisons(prepared, lines, margin, resamples, planned)
            sections += table + [""]
            if plot(primary, report.with_name(f"differences-{chash}.png")):
                sections += [f"![per-seed differences](differences-{chash}.png)", ""]
    report.write_text("\n".join(sections) + "\n", encoding="utf-8")

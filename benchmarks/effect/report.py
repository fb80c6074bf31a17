"""REPORT.md and its plots, generated from an effect run's results folder only (see run.py).

Statistics, per arm and TMR setting, against random masking with the same fine-tuning seed:
- paired t-test over seeds (`scipy.stats.ttest_rel`) of test accuracy and of macro-F1;
- paired bootstrap over test examples: the per-example correctness averaged over the seeds both
  arms have, the difference resampled (10,000 times, fixed generator) for a 95% interval of the
  accuracy difference and a two-sided p-value (twice the smaller tail share at 0).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

BOOTSTRAP_SAMPLES = 10_000
ARM_ORDER = ["none", "random", "whole_word", "difference", "difference_ww"]
ARM_TITLES = {
    "none": "no continued pretraining",
    "random": "random (BERT 15%)",
    "whole_word": "whole-word random",
    "difference": "difference (K=20, nearest seed, 15%)",
    "difference_ww": "difference, whole words",
}
BASELINE = "random"


def load_results(results: Path) -> dict[str, Any]:
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted((results / "runs").glob("*/seed*/*.json")):
        arm, seed = path.parent.parent.name, int(path.parent.name.removeprefix("seed"))
        runs.setdefault(arm, {}).setdefault(seed, {})[path.stem] = json.loads(path.read_text(encoding="utf-8"))
    datasets = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted((results / "datasets").glob("*.json"))}
    read = lambda name: json.loads((results / name).read_text(encoding="utf-8")) if (results / name).exists() else None  # noqa: E731
    return {"runs": runs, "datasets": datasets, "run": read("run.json"), "data": read("data.json")}


def arm_names(runs: dict[str, Any]) -> list[str]:
    return [a for a in ARM_ORDER if a in runs] + sorted(a for a in runs if a not in ARM_ORDER)


def scores(runs: dict[str, Any], arm: str, tmr: float) -> dict[int, dict[str, Any]]:
    """seed -> test metrics (accuracy, macro_f1, predictions) of one arm's fine-tuning."""
    key = f"finetune-tmr{tmr}"
    return {seed: r[key]["evaluation"]["test"] for seed, r in sorted(runs.get(arm, {}).items()) if key in r}


def held_out(runs: dict[str, Any], arm: str) -> list[float]:
    return [r["pretrain"]["held_out"]["perplexity"] for _, r in sorted(runs.get(arm, {}).items())
            if "pretrain" in r and r["pretrain"].get("held_out")]


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def paired_tests(arm: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]],
                 test_labels: list[int] | None) -> dict[str, Any]:
    """Paired comparison of an arm with the baseline over the seeds both have."""
    from scipy import stats

    seeds = sorted(set(arm) & set(base))
    out: dict[str, Any] = {"seeds": seeds}
    for metric in ("accuracy", "macro_f1"):
        diffs = [arm[s][metric] - base[s][metric] for s in seeds]
        out[f"d_{metric}"] = float(np.mean(diffs)) if diffs else math.nan
        out[f"p_{metric}"] = (float(stats.ttest_rel([arm[s][metric] for s in seeds], [base[s][metric] for s in seeds])
                                    .pvalue) if len(seeds) >= 2 and np.std(diffs) > 0 else math.nan)
    out["ci_accuracy"], out["p_bootstrap"] = (math.nan, math.nan), math.nan
    if seeds and test_labels is not None and all(len(arm[s]["predictions"]) == len(test_labels) for s in seeds):
        labels = np.asarray(test_labels)
        correct = lambda runs: np.mean([np.asarray(runs[s]["predictions"]) == labels for s in seeds], axis=0)  # noqa: E731
        per_example = correct(arm) - correct(base)
        rng = np.random.default_rng(0)
        index = rng.integers(0, len(per_example), size=(BOOTSTRAP_SAMPLES, len(per_example)))
        boot = per_example[index].mean(axis=1)
        out["ci_accuracy"] = (float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975)))
        out["p_bootstrap"] = float(min(1.0, 2 * min((boot <= 0).mean(), (boot >= 0).mean())))
    return out


def fmt(value: float, digits: int = 4) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def fmt_ms(values: list[float], digits: int = 4) -> str:
    m, s = mean_std(values)
    return "–" if math.isnan(m) else f"{m:.{digits}f} ± {s:.{digits}f}"


def plot_loss_curves(runs: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm in arm_names(runs):
        seeds = [r["pretrain"] for _, r in sorted(runs[arm].items()) if "pretrain" in r]
        if not seeds:
            continue
        for i, record in enumerate(seeds):
            train = [(c["step"], c["loss"]) for c in record["curves"] if c["split"] == "train"]
            held = [(c["step"], c["loss"]) for c in record["curves"] if c["split"] == "held_out"]
            label = arm if i == 0 else None
            color = f"C{arm_names(runs).index(arm)}"
            if train:
                left.plot(*zip(*train, strict=True), color=color, alpha=0.7, label=label)
            if held:
                right.plot(*zip(*held, strict=True), color=color, marker="o", alpha=0.7, label=label)
    left.set(title="training loss (own masking strategy), every seed", xlabel="step", ylabel="MLM loss")
    right.set(title="held-out loss (fixed random masking), every seed", xlabel="step", ylabel="MLM loss")
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_accuracy(runs: dict[str, Any], tmrs: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = arm_names(runs)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / max(len(tmrs), 1)
    for ax, metric in zip(axes, ("accuracy", "macro_f1"), strict=True):
        for j, tmr in enumerate(tmrs):
            means, stds, xs = [], [], []
            for i, arm in enumerate(arms):
                values = [s[metric] for s in scores(runs, arm, tmr).values()]
                if values:
                    m, s = mean_std(values)
                    means.append(m)
                    stds.append(s)
                    xs.append(i + (j - (len(tmrs) - 1) / 2) * width)
                    ax.scatter([xs[-1]] * len(values), values, color="black", s=8, zorder=3)
            ax.bar(xs, means, width=width, yerr=stds, capsize=3, label=f"TMR p={tmr}", alpha=0.8)
        ax.set_xticks(range(len(arms)), arms, rotation=20, ha="right", fontsize=8)
        ax.set(title=f"test {metric} (mean ± std over seeds; dots: seeds)", ylabel=metric)
        low = min((s[metric] for arm in arms for tmr in tmrs for s in scores(runs, arm, tmr).values()), default=0)
        ax.set_ylim(max(0.0, low - 0.05), None)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(results: Path, report: Path, config: dict[str, Any]) -> None:
    loaded = load_results(results)
    runs, datasets, run_meta, data = loaded["runs"], loaded["datasets"], loaded["run"], loaded["data"]
    tmrs = list(config["tmr"])
    seeds = list(config["seeds"])
    test_labels = data["test_label_ids"] if data else None
    rel = lambda p: Path(os.path.relpath(Path(p).resolve(), report.resolve().parent)).as_posix()  # noqa: E731
    plot_loss_curves(runs, results / "loss_curves.png")
    plot_accuracy(runs, tmrs, results / "accuracy.png")

    lines = ["# Does difference masking beat random masking on real data?", "",
             "Generated by `benchmarks/effect/run.py` from the run's results in "
             f"`{rel(results)}/` (nothing in this file is written by hand).", ""]
    # --- what was run
    sessions = (run_meta or {}).get("sessions", [])
    lines += ["## Setup", ""]
    if sessions:
        last = sessions[-1]
        lines += [f"- Command: `{last['command']}`"
                  + (f" ({len(sessions)} sessions: a rerun skips the finished runs and adds the missing ones)"
                     if len(sessions) > 1 else ""),
                  f"- Config `{last['config']}`: `{json.dumps(config)}`",
                  f"- Wall time: {sum(s['wall_seconds'] for s in sessions) / 60:.1f} min "
                  "(" + " + ".join(f"{s['wall_seconds'] / 60:.1f}" for s in sessions) + ")",
                  "- Versions: " + ", ".join(f"{k} {v}" for k, v in last["environment"].items())]
    else:
        lines += ["- The run has not finished: no `run.json` yet (the tables show the runs completed so far)."]
    if data:
        lines += ["- Downstream task: the section of a Debian package description; split by the sha256 of the "
                  "package name, read as a number in [0, 1): "
                  + ", ".join(f"{name} [{low}, {high})" for name, (low, high) in data["splits"].items())
                  + f". Rows per split and label: `{json.dumps(data['counts'])}`. Domain corpus for the stats, "
                  f"seeds and continued pretraining: {data['domain_documents']} of these descriptions."]
    stage_seconds: dict[str, float] = {}
    for ds in datasets.values():
        for k, v in ds["seconds"].items():
            stage_seconds[k] = stage_seconds.get(k, 0.0) + v
    for arm_runs in runs.values():
        for r in arm_runs.values():
            for name, rec in r.items():
                stage = "train" if name == "pretrain" else "finetune"
                stage_seconds[stage] = stage_seconds.get(stage, 0.0) + rec["seconds"]
    lines += ["- Time per stage (s, summed over runs): "
              + ", ".join(f"{k} {v:.0f}" for k, v in stage_seconds.items()), ""]

    # --- seeds
    for name, ds in sorted(datasets.items(), key=lambda kv: kv[0] != "main"):
        lines += [f"### Seeds of `{name}` dataset "
                  f"({'general text: wordfreq' if not ds['variant'] else 'variant ' + json.dumps(ds['variant'])})", "",
                  f"{ds['documents']} documents, {ds['distinct_words']} distinct words, {ds.get('rows') or '–'} "
                  f"sequences, {ds.get('tokens') or '–'} tokens.", "",
                  "| # | seed | tf | df | general freq | TF-ICF |", "|---:|---|---:|---:|---:|---:|"]
        lines += [f"| {i} | {s['word']} | {s['tf']} | {s['df']} | {s['general_frequency']:.2e} | {s['tf_icf']:.5f} |"
                  for i, s in enumerate(ds["seeds"], 1)]
        lines += ["", f"![mask probabilities]({rel(results / f'mask_probabilities-{name}.png')})", ""]
        analysis = ds.get("mask_analysis")
        if analysis:
            sim = analysis["word_similarity"]
            lines += [f"Where `difference` puts the masks ({analysis['tokens']:,} non-special tokens; stored "
                      f"probability mean {analysis['mean']:.3f}, std {analysis['std']:.3f}, quantiles "
                      + ", ".join(f"{q}: {v:.3f}" for q, v in analysis["quantiles"].items()) + "): "
                      f"the seed words are {100 * analysis['seed_token_share']:.1f}% of the tokens and get "
                      f"{100 * analysis['share_on_seed_words']:.1f}% of the expected masks; the 10% most likely "
                      f"tokens get {100 * analysis['share_on_top_10pct_tokens']:.1f}% (random masking: 10%). "
                      f"Word-to-nearest-seed cosine: mean {sim['mean']:.3f}, std {sim['std']:.3f}, min "
                      f"{sim['min']:.3f}, max {sim['max']:.3f}. The words with the most expected masks "
                      "(lift = expected masks / what random masking gives them):", "",
                      "| word | tokens | expected masks | lift |", "|---|---:|---:|---:|"]
            lines += [f"| {w['word']} | {w['tokens']} | {w['expected_masks']:.1f} | {w['lift']:.2f} |"
                      for w in analysis["top_words"]]
            lines.append("")

    # --- main table
    lines += ["## Results", "",
              "Test accuracy and macro-F1: mean ± std over seeds. Δ: mean paired difference to `random` "
              "(same seed), with the paired t-test's p over seeds and a paired bootstrap over test examples "
              "(95% interval of Δ accuracy, p). Held-out perplexity: MLM on held-out rows with the same fixed "
              "random masking for every arm, after continued pretraining.", ""]
    header = ("| arm | TMR p | seeds | accuracy | macro-F1 | held-out ppl | Δ acc | p (t, acc) | Δ F1 | p (t, F1) "
              "| bootstrap 95% CI Δ acc | p (bootstrap) |")
    lines += [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    comparisons: dict[tuple[str, float], dict[str, Any]] = {}
    for tmr in tmrs:
        base = scores(runs, BASELINE, tmr)
        for arm in arm_names(runs):
            arm_scores = scores(runs, arm, tmr)
            if not arm_scores:
                continue
            row = [f"{arm}", f"{tmr}", str(len(arm_scores)),
                   fmt_ms([s["accuracy"] for s in arm_scores.values()]),
                   fmt_ms([s["macro_f1"] for s in arm_scores.values()]),
                   fmt_ms(held_out(runs, arm), 1) if arm != "none" else "–"]
            if arm != BASELINE and base:
                c = paired_tests(arm_scores, base, test_labels)
                comparisons[arm, tmr] = c
                row += [f"{c['d_accuracy']:+.4f}", fmt(c["p_accuracy"], 3), f"{c['d_macro_f1']:+.4f}",
                        fmt(c["p_macro_f1"], 3),
                        f"[{c['ci_accuracy'][0]:+.4f}, {c['ci_accuracy'][1]:+.4f}]"
                        if not math.isnan(c["ci_accuracy"][0]) else "–", fmt(c["p_bootstrap"], 3)]
            else:
                row += ["(baseline)" if arm == BASELINE else "–"] + ["–"] * 5
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"![accuracy per arm]({rel(results / 'accuracy.png')})", "",
              f"![loss curves]({rel(results / 'loss_curves.png')})", ""]

    # --- per seed
    lines += ["### Every run", "", "| arm | seed | TMR p | test accuracy | test macro-F1 | validation macro-F1 "
              "| held-out ppl | train s | finetune s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in arm_names(runs):
        for seed, r in sorted(runs[arm].items()):
            for tmr in tmrs:
                f = r.get(f"finetune-tmr{tmr}")
                if f is None:
                    continue
                p = r.get("pretrain")
                lines.append(f"| {arm} | {seed} | {tmr} | {f['evaluation']['test']['accuracy']:.4f} | "
                             f"{f['evaluation']['test']['macro_f1']:.4f} | "
                             f"{f['evaluation']['validation']['macro_f1']:.4f} | "
                             f"{fmt(p['held_out']['perplexity'], 1) if p else '–'} | "
                             f"{fmt(p['seconds'], 0) if p else '–'} | {f['seconds']:.0f} |")
    lines.append("")

    # --- what did not run
    expected = [(arm, seed, tmr) for arm in ARM_ORDER for seed in seeds for tmr in tmrs]
    expected += [(f"difference[{name}]", seed, tmrs[0]) for name in config["ablations"] for seed in seeds]
    missing = [e for e in expected if f"finetune-tmr{e[2]}" not in runs.get(e[0], {}).get(e[1], {})]
    lines += ["### Runs that did not complete", ""]
    lines += (["None: every planned arm, seed and TMR setting ran."] if not missing else
              [f"{len(missing)} of {len(expected)} planned fine-tuning runs have no result (the run was stopped "
               "before them, at the deadline; the command continues them when run again): "
               + ", ".join(f"{a} seed {s} TMR {t}" for a, s, t in missing)])
    lines.append("")

    # --- ablations: each against plain difference masking, same seeds
    ablation_arms = [a for a in arm_names(runs) if a.startswith("difference[")]
    if ablation_arms:
        lines += ["## Ablation", "",
                  "Difference masking with another masking setup (its seeds and mask probabilities above), "
                  f"against plain `difference` with the same seeds, TMR p={tmrs[0]}.", "",
                  "| ablation | seeds | accuracy | macro-F1 | held-out ppl | Δ acc vs difference | p (t) "
                  "| Δ F1 vs difference | p (t) | bootstrap 95% CI Δ acc | p (bootstrap) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for arm in ablation_arms:
            arm_scores = scores(runs, arm, tmrs[0])
            c = paired_tests(arm_scores, scores(runs, "difference", tmrs[0]), test_labels)
            comparisons[f"{arm} vs difference", tmrs[0]] = c
            lines.append(f"| {arm} | {len(arm_scores)} | {fmt_ms([s['accuracy'] for s in arm_scores.values()])} | "
                         f"{fmt_ms([s['macro_f1'] for s in arm_scores.values()])} | {fmt_ms(held_out(runs, arm), 1)} | "
                         f"{fmt(c['d_accuracy'])} | {fmt(c['p_accuracy'], 3)} | {fmt(c['d_macro_f1'])} | "
                         f"{fmt(c['p_macro_f1'], 3)} | "
                         + (f"[{c['ci_accuracy'][0]:+.4f}, {c['ci_accuracy'][1]:+.4f}]"
                            if not math.isnan(c["ci_accuracy"][0]) else "–") + f" | {fmt(c['p_bootstrap'], 3)} |")
        lines.append("")
        main_seeds = {x["word"] for x in datasets.get("main", {}).get("seeds", [])}
        for name, ds in datasets.items():
            if name == "main":
                continue
            own = {x["word"] for x in ds["seeds"]}
            lines += [f"Seeds of `{name}` not among the main seeds: {', '.join(sorted(own - main_seeds)) or 'none'}; "
                      f"main seeds it drops: {', '.join(sorted(main_seeds - own)) or 'none'}.", ""]

    # --- reading
    lines += ["## Reading", ""]
    pretrained = [r["pretrain"] for arm in arm_names(runs) for r in runs[arm].values() if "pretrain" in r]
    if pretrained:
        first = pretrained[0]
        tokens = first["config"]["batch_size"] * first["config"]["total_steps"] * config["max_length"]
        start = [c["loss"] for p in pretrained for c in p["curves"] if c["split"] == "held_out" and c["step"] == 0]
        end = [p["held_out"]["loss"] for p in pretrained]
        lines.append(f"- Scale: each continued-pretraining run took {first['config']['total_steps']} steps of "
                     f"{first['config']['batch_size']} sequences of at most {config['max_length']} tokens (at most "
                     f"{tokens:,} tokens); the held-out MLM loss went from {np.mean(start):.2f} to "
                     f"{np.mean(end):.2f} on average over the runs. The offline MiniLM has no MLM head: `train` "
                     "adds one, so most of that drop is the new head learning, not the encoder adapting to the "
                     "domain.")
    for (arm, tmr), c in comparisons.items():
        if not c["seeds"]:
            continue
        versus = "" if " vs " in arm else " vs `random`"
        t_significant = not math.isnan(c["p_accuracy"]) and c["p_accuracy"] < 0.05
        lines.append(f"- `{arm}`{versus}, TMR p={tmr}, {len(c['seeds'])} paired seeds: accuracy "
                     f"{100 * c['d_accuracy']:+.2f} points, macro-F1 {100 * c['d_macro_f1']:+.2f} points; "
                     f"paired t-test over seeds p {fmt(c['p_accuracy'], 3)} (accuracy), {fmt(c['p_macro_f1'], 3)} "
                     f"(macro-F1): {'significant' if t_significant else 'not significant'} at 0.05; bootstrap over "
                     f"test examples p {fmt(c['p_bootstrap'], 3)}.")
    spreads = [mean_std([x["accuracy"] for x in scores(runs, arm, tmr).values()])[1]
               for arm in arm_names(runs) for tmr in tmrs if len(scores(runs, arm, tmr)) > 1]
    deltas = [abs(c["d_accuracy"]) for c in comparisons.values() if c["seeds"]]
    if spreads and deltas:
        lines.append(f"- Noise: within an arm, the seed-to-seed standard deviation of test accuracy averages "
                     f"{100 * float(np.mean(spreads)):.2f} points; the largest mean difference between arms is "
                     f"{100 * max(deltas):.2f} points. The bootstrap resamples test examples with the fine-tuned "
                     "models held fixed, so it measures test-set sampling only, not the variation between "
                     "training seeds: where the two disagree, the t-test over seeds is the one that answers "
                     "whether the arm helps.")
    verdict = [(arm, tmr, c) for (arm, tmr), c in comparisons.items()
               if arm in ("difference", "difference_ww") and c["seeds"]]
    if verdict:
        wins = [f"`{a}` (TMR {t})" for a, t, c in verdict
                if c["d_accuracy"] > 0 and not math.isnan(c["p_accuracy"]) and c["p_accuracy"] < 0.05]
        lines.append("- Answer at this scale: " + (
            "difference masking beats random masking significantly over seeds for " + ", ".join(wins) + "."
            if wins else "no significant gain of difference masking over random masking in accuracy over seeds "
            "(differences: " + ", ".join(f"`{a}` TMR {t}: {100 * c['d_accuracy']:+.2f}" for a, t, c in verdict)
            + " points)."))
    lines.append("")
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")

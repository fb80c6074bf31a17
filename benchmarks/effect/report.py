"""REPORT.md and its plots, generated from every line of the effect experiment's results file.

Lines are grouped by config hash (same config, model, corpus, splits, datasets and warmed head):
only lines of one hash are compared, so later runs add seeds to their experiment and a GPU run
is its own experiment. Statistics are over seeds, paired by seed (paired.py).
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from paired import ALPHA, POWER, mean_sd, paired_summary

BASELINE = "random"
CONTROL_ARM, NONE_ARM = "random", "none"
ARM_ORDER = ["none", "random", "whole_word", "difference", "difference_ww"]


def load(results: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """(config hash -> arm lines, the last of each (arm, seed)), (config hash -> selection line)."""
    arms: dict[str, dict[tuple[str, int], dict[str, Any]]] = defaultdict(dict)
    selections: dict[str, dict[str, Any]] = {}
    for line in results.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record["kind"] == "selection":
            selections[record["config_hash"]] = record
        elif record["kind"] == "arm":
            arms[record["config_hash"]][record["arm"], record["seed"]] = record
    return {h: list(lines.values()) for h, lines in arms.items()}, selections


def arm_names(lines: list[dict[str, Any]]) -> list[str]:
    present = {r["arm"] for r in lines}
    return [a for a in ARM_ORDER if a in present] + sorted(present - set(ARM_ORDER))


def by_seed(lines: list[dict[str, Any]], arm: str, metric) -> dict[int, float]:
    """seed -> metric(line) for one arm, skipping lines where it is None."""
    out = {}
    for r in lines:
        if r["arm"] == arm and (value := metric(r)) is not None:
            out[r["seed"]] = value
    return dict(sorted(out.items()))


def pts(x: float) -> str:
    """A fraction as percentage points with sign."""
    return "–" if x is None or math.isnan(x) else f"{100 * x:+.2f}"


def pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.2f}"


def num(x: float, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def ci(c: dict[str, Any], scale: float = 100.0, digits: int = 2) -> str:
    low, high = c["ci"]
    if math.isnan(low):
        return "–"
    return f"[{scale * low:+.{digits}f}, {scale * high:+.{digits}f}]"


def majority_macro_f1(majority: float, classes: int) -> float:
    """Macro-F1 of always predicting the majority class: its F1 is 2m/(1+m), the others 0."""
    return 2 * majority / (1 + majority) / classes


# --- plots ------------------------------------------------------------------------------------


def plot_downstream(lines: list[dict[str, Any]], majority: float, classes: int, path: Path, title: str) -> None:
    """Test accuracy and macro-F1 per arm (every seed, mean and 95% t-interval, majority line from
    zero up), and the paired difference to random per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    arms = arm_names(lines)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    rng = np.random.default_rng(0)
    for ax, metric, chance in ((axes[0], "accuracy", majority), (axes[1], "macro_f1", majority_macro_f1(majority, classes))):
        for i, arm in enumerate(arms):
            values = list(by_seed(lines, arm, lambda r, m=metric: r["test"][m]).values())
            ax.scatter(i - 0.15 + rng.uniform(-0.05, 0.05, len(values)), values, s=14, color="0.45", zorder=3,
                       label="one seed" if i == 0 else None)
            m, s = mean_sd(values)
            half = stats.t.ppf(1 - ALPHA / 2, len(values) - 1) * s / math.sqrt(len(values)) if len(values) > 1 else 0
            ax.errorbar([i + 0.15], [m], yerr=[[half], [half]], fmt="o", color=f"C{i}", capsize=5, zorder=4,
                        label="mean, 95% t-interval" if i == 0 else None)
        ax.axhline(chance, color="crimson", linestyle="--", linewidth=1,
                   label=f"majority class ({chance:.3f})")
        ax.set_ylim(0, 1)
        ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right")
        ax.set(title=f"test {metric.replace('_', '-')}", ylabel=metric.replace("_", "-"))
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8, loc="lower right")
    ax = axes[2]
    others = [a for a in arms if a != BASELINE]
    base = by_seed(lines, BASELINE, lambda r: r["test"]["accuracy"])
    for i, arm in enumerate(others):
        c = paired_summary(by_seed(lines, arm, lambda r: r["test"]["accuracy"]), base)
        ax.scatter([i - 0.15] * c["n"], [100 * d for d in c["differences"]], s=14, color="0.45", zorder=3)
        if c["n"] > 1 and not math.isnan(c["ci"][0]):
            ax.errorbar([i + 0.15], [100 * c["mean"]], yerr=[[100 * (c["mean"] - c["ci"][0])],
                                                             [100 * (c["ci"][1] - c["mean"])]],
                        fmt="o", color="black", capsize=5)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(others)), [f"{a} − random" for a in others], rotation=30, ha="right")
    ax.set(title="paired Δ test accuracy vs random (points)\nper seed (grey), mean and 95% t-interval",
           ylabel="percentage points")
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_intrinsic(lines: list[dict[str, Any]], path: Path, title: str) -> None:
    """Held-out MLM loss per arm (common random masking, own masking, seed-similar tokens, the rest),
    every seed and the mean, y from zero; and the held-out loss during continued pretraining."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = arm_names(lines)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8))
    measures = [("random", "common random masking"), ("own", "own masking"),
                ("random_seed_similar", "seed-similar tokens (random masking)"),
                ("random_rest", "other tokens (random masking)")]
    width = 0.8 / len(measures)
    for j, (key, label) in enumerate(measures):
        for i, arm in enumerate(arms):
            values = list(by_seed(lines, arm, lambda r, k=key: r["intrinsic"].get(k)).values())
            if not values:
                continue
            x = i + (j - (len(measures) - 1) / 2) * width
            left.bar([x], [np.mean(values)], width=width * 0.9, color=f"C{j}", alpha=0.6,
                     label=label if i == 0 or (key == "own" and arm == arms[1 if len(arms) > 1 else 0]) else None)
            left.scatter([x] * len(values), values, s=8, color="black", zorder=3)
    left.set_ylim(0, left.get_ylim()[1] * 1.35)  # room for the legend above the bars
    left.set_xticks(range(len(arms)), arms, rotation=30, ha="right")
    left.set(title="held-out MLM loss after continued pretraining\n(bars: mean; dots: seeds)", ylabel="loss (nats)")
    handles, labels = left.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    left.legend(unique.values(), unique.keys(), fontsize=8, loc="upper center", ncol=2)
    left.grid(alpha=0.3, axis="y")
    for i, arm in enumerate(arms):
        for k, r in enumerate(r for r in lines if r["arm"] == arm and r.get("pretraining")):
            held = [(c["step"], c["loss"]) for c in r["pretraining"]["curves"] if c["split"] == "held_out"]
            if held:
                right.plot(*zip(*held, strict=True), color=f"C{i}", marker="o", alpha=0.6, label=arm if k == 0 else None)
    right.set_ylim(0, None)
    right.set(title="held-out loss during continued pretraining (random masking), every seed", xlabel="step",
              ylabel="loss (nats)")
    right.grid(alpha=0.3)
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- the report ---------------------------------------------------------------------------------


def experiment_section(chash: str, lines: list[dict[str, Any]], selection: dict[str, Any] | None,
                       plots: Path, rel) -> list[str]:
    first = next((r for r in lines if r.get("pretraining")), lines[0])
    prepared = first["prepared"]
    config_name = first["config_name"]
    arms = arm_names(lines)
    seeds = sorted({r["seed"] for r in lines})
    majority = prepared["majority"]["test"]
    classes = len(prepared["labels"])
    title = f"{config_name} ({chash})"
    accuracy = {arm: by_seed(lines, arm, lambda r: r["test"]["accuracy"]) for arm in arms}
    macro_f1 = {arm: by_seed(lines, arm, lambda r: r["test"]["macro_f1"]) for arm in arms}
    mlm = {arm: by_seed(lines, arm, lambda r: r["intrinsic"]["random"]) for arm in arms}
    out = [f"## Experiment `{config_name}`, config hash `{chash}`: {len(lines)} runs, seeds {seeds}", ""]

    # 1. positive control, first
    out += ["### 1. Positive control: does continued pretraining (random masking) beat none?", ""]
    warm = prepared.get("warm")
    if warm:
        out += [f"Every arm starts from one warmed checkpoint (sha256 `{prepared['warm_sha256'][:16]}`): MiniLM with "
                f"its MLM head trained alone ({warm['trainable_parameters']:,} parameters, encoder and tied "
                f"embeddings frozen) for {warm['steps']} steps of {warm['batch_size']} rows, random masking; training "
                f"loss {warm['loss_first']:.2f} → {warm['loss_last10']:.2f} nats (mean of the last 10 steps). `none` "
                "fine-tunes it as it is (its encoder is MiniLM's). Part of what continued pretraining gains on MLM "
                "loss is the encoder adapting to that head, not only to the domain: the downstream line below is "
                "the one that says whether it helps the task.", ""]
    control_ok = None
    if CONTROL_ARM in arms and NONE_ARM in arms:
        c_mlm = paired_summary(mlm[CONTROL_ARM], mlm[NONE_ARM])
        c_acc = paired_summary(accuracy[CONTROL_ARM], accuracy[NONE_ARM])
        c_f1 = paired_summary(macro_f1[CONTROL_ARM], macro_f1[NONE_ARM])
        control_ok = c_mlm["n"] >= 2 and not math.isnan(c_mlm["ci"][1]) and c_mlm["ci"][1] < 0
        none_loss = mean_sd(list(mlm[NONE_ARM].values()))[0]
        out += [f"- **Held-out domain MLM loss (common random masking): "
                f"{'PASSES' if control_ok else 'FAILS'}.** `none` {num(none_loss)} nats; `random` "
                f"{num(mean_sd(list(mlm[CONTROL_ARM].values()))[0])} ± {num(mean_sd(list(mlm[CONTROL_ARM].values()))[1])}; "
                f"paired Δ (random − none) {num(c_mlm['mean'])} nats, 95% t-interval "
                f"{ci(c_mlm, 1.0, 3)}, Wilcoxon p {num(c_mlm['p_wilcoxon'])}, n = {c_mlm['n']} seeds. "
                "(Passing means the whole interval is below zero.)",
                f"- **Downstream (test accuracy):** Δ (random − none) {pts(c_acc['mean'])} points, 95% t-interval "
                f"{ci(c_acc)}, Wilcoxon p {num(c_acc['p_wilcoxon'])}, t-test p {num(c_acc['p_t'])}; macro-F1 Δ "
                f"{pts(c_f1['mean'])} points, {ci(c_f1)}. "
                + ("Continued pretraining **beats none downstream** at this scale (interval above zero)."
                   if c_acc["n"] >= 2 and c_acc["ci"][0] > 0 else
                   "Continued pretraining **does worse than none downstream** (interval below zero)."
                   if c_acc["n"] >= 2 and c_acc["ci"][1] < 0 else
                   "Continued pretraining is **not distinguishable from none downstream** at this scale "
                   f"(the interval contains zero; effects below {pts(c_acc['mde'])} points are not detectable "
                   "with 80% power here)."), ""]
        if not control_ok:
            out += ["**The positive control failed: the experiment is underpowered. It makes no claim about "
                    "difference vs random masking** (the tables below are shown for the record only).", ""]
    else:
        out += ["The control needs the `none` and `random` arms; this experiment lacks one, so it makes no claim.",
                ""]

    # 2. power statement
    out += ["### 2. Power", ""]
    if BASELINE in arms:
        for arm in (a for a in arms if a not in (BASELINE, NONE_ARM)):
            c = paired_summary(accuracy[arm], accuracy[BASELINE])
            out.append(f"- `{arm}` − `random`, test accuracy, {c['n']} paired seeds: sd of the paired differences "
                       f"{pct(c['sd'])} points, so the minimum detectable effect (two-sided paired t-test, "
                       f"α = {ALPHA}, power {POWER:.0%}) is **{pct(c['mde'])} points**. A true effect smaller than "
                       "that would usually be missed; quadrupling the seeds roughly halves it.")
        out.append("")

    # 3. paired table
    out += ["### 3. Paired results, every arm against `random` (same seeds)", "",
            f"Test set: {sum(prepared['counts']['test'].values())} texts; always predicting the majority class "
            f"gives accuracy {majority:.4f}, macro-F1 {majority_macro_f1(majority, classes):.4f}. Δ in percentage "
            "points, mean over seeds of (arm − random) for the same seed; 95% t-interval over seeds; Wilcoxon "
            "signed-rank p (two-sided; exact, so with 5 seeds it cannot go below 0.0625 however large the "
            "effect); MDE: minimum detectable effect at 80% power.", "",
            "| arm | seeds | accuracy (mean ± sd) | macro-F1 (mean ± sd) | Δ accuracy | 95% CI | Wilcoxon p "
            "| t-test p | MDE | Δ macro-F1 | 95% CI | Wilcoxon p |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in arms:
        a_m, a_s = mean_sd(list(accuracy[arm].values()))
        f_m, f_s = mean_sd(list(macro_f1[arm].values()))
        row = [f"`{arm}`", str(len(accuracy[arm])), f"{a_m:.4f} ± {num(a_s, 4)}", f"{f_m:.4f} ± {num(f_s, 4)}"]
        if arm == BASELINE or BASELINE not in arms:
            row += ["(baseline)" if arm == BASELINE else "–"] + ["–"] * 7
        else:
            c = paired_summary(accuracy[arm], accuracy[BASELINE])
            g = paired_summary(macro_f1[arm], macro_f1[BASELINE])
            row += [pts(c["mean"]), ci(c), num(c["p_wilcoxon"]), num(c["p_t"]), pct(c["mde"]), pts(g["mean"]), ci(g),
                    num(g["p_wilcoxon"])]
        out.append("| " + " | ".join(row) + " |")
    out += ["", f"![downstream]({rel(plots / f'downstream-{config_name}-{chash}.png')})", ""]

    # 4. intrinsic
    out += ["### 4. Held-out MLM loss (fair to every arm)", "",
            first["intrinsic"]["definition"], "",
            "| arm | own masking | common random masking | seed-similar tokens | other tokens | "
            "Δ common random vs random arm | 95% CI | Δ seed-similar vs random arm | 95% CI |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    similar = {arm: by_seed(lines, arm, lambda r: r["intrinsic"]["random_seed_similar"]) for arm in arms}
    for arm in arms:
        row = [f"`{arm}`"] + [
            (lambda v: "–" if not v else f"{np.mean(v):.3f} ± {num(mean_sd(v)[1])}")(
                list(by_seed(lines, arm, lambda r, k=key: r["intrinsic"].get(k)).values()))
            for key in ("own", "random", "random_seed_similar", "random_rest")]
        if arm != BASELINE and BASELINE in arms:
            c, s = paired_summary(mlm[arm], mlm[BASELINE]), paired_summary(similar[arm], similar[BASELINE])
            row += [num(c["mean"]), ci(c, 1.0, 3), num(s["mean"]), ci(s, 1.0, 3)]
        else:
            row += ["–"] * 4
        out.append("| " + " | ".join(row) + " |")
    out += ["", f"![held-out MLM loss]({rel(plots / f'intrinsic-{config_name}-{chash}.png')})", ""]

    # 5. conclusion
    out += ["### 5. What this can and cannot conclude", ""]
    if "difference" in arms and BASELINE in arms:
        c = paired_summary(accuracy["difference"], accuracy[BASELINE])
        s = paired_summary(similar["difference"], similar[BASELINE])
        if control_ok:
            if c["n"] >= 2 and c["ci"][0] > 0:
                verdict = (f"Difference masking beats random masking downstream: Δ {pts(c['mean'])} points, "
                           f"95% CI {ci(c)}.")
            elif c["n"] >= 2 and c["ci"][1] < 0:
                verdict = (f"Difference masking does worse than random masking downstream: Δ {pts(c['mean'])} "
                           f"points, 95% CI {ci(c)}.")
            else:
                verdict = (f"No difference between difference and random masking is detectable downstream: "
                           f"Δ {pts(c['mean'])} points, 95% CI {ci(c)}, Wilcoxon p {num(c['p_wilcoxon'])}. "
                           f"This design detects {pct(c['mde'])} points with 80% power: it rules out effects "
                           f"outside the interval, not smaller ones. It does **not** show the two are equal.")
            out.append("- " + verdict)
        else:
            out.append("- The positive control failed, so no conclusion about difference vs random masking is "
                       "drawn, whatever the table shows.")
        if control_ok and CONTROL_ARM in arms and NONE_ARM in arms:
            d = paired_summary(accuracy[CONTROL_ARM], accuracy[NONE_ARM])
            if d["n"] >= 2 and d["ci"][0] <= 0 <= d["ci"][1]:
                out.append("- Continued pretraining itself (random vs none) is not distinguishable from none "
                           f"downstream here (Δ {pts(d['mean'])} points, {ci(d)}): the masking strategies are compared "
                           "in a regime where pretraining barely reaches the task, so a null difference-vs-random "
                           "result says little about settings where pretraining helps.")
        overall = paired_summary(mlm["difference"], mlm[BASELINE])
        out.append(f"- Held-out MLM loss, common random masking: difference − random {num(overall['mean'])} nats, "
                   f"95% CI {ci(overall, 1.0, 3)} (overall, " + ("better" if overall["ci"][1] < 0 else "worse"
                                                                 if overall["ci"][0] > 0 else "not distinguishable")
                   + ").")
        out.append(f"- Intrinsically, on seed-similar held-out tokens (common random masking), difference − random "
                   f"loss is {num(s['mean'])} nats, 95% CI {ci(s, 1.0, 3)}: "
                   + ("difference masking learns the tokens it targets better."
                      if s["n"] >= 2 and s["ci"][1] < 0 else
                      "difference masking learns the tokens it targets worse." if s["n"] >= 2 and s["ci"][0] > 0
                      else "not distinguishable."))
    model = Path(prepared["model"])
    out += [f"- Scope: one model (`{model.parent.name if model.name == 'model' else model.name}`), one corpus of "
            f"Debian package descriptions ({prepared['domain_rows']} pretraining texts), "
            f"{first['pretraining']['steps'] if first.get('pretraining') else 'no'} "
            "continued-pretraining steps, a 3-class section classifier. It cannot say what happens with "
            "a larger model, longer pretraining, or other domains; the `gpu` config is the next step.", ""]

    mask_plot = plots / f"mask_probabilities-{config_name}.png"
    if mask_plot.exists():
        out += [f"Stored mask probabilities of the `main` dataset (`maskstream inspect`): "
                f"![mask probabilities]({rel(mask_plot)})", ""]
    signal_plot = mask_plot.with_name(mask_plot.stem + "_signal.png")
    if signal_plot.exists():
        out += [f"Where that dataset's masking budget goes (`maskstream inspect`'s signal plot): "
                f"![masking signal]({rel(signal_plot)})", ""]

    # selection
    if selection:
        out += ["### Fine-tuning hyperparameters, chosen on validation before any arm ran", "",
                selection["rule"], "", "| learning rate | TMR p | validation macro-F1 | validation accuracy "
                "| best epoch | s |", "|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {g['learning_rate']:g} | {g['tmr']} | {g['validation_macro_f1']:.4f} | "
                f"{g['validation_accuracy']:.4f} | {g['best_epoch']} | {g['seconds']:.0f} |" for g in selection["grid"]]
        out += ["", f"Chosen: learning rate {selection['chosen']['learning_rate']:g}, TMR p "
                f"{selection['chosen']['tmr']}.", ""]

    # data
    out += ["### Data", "",
            "- Labeled texts split by sha256 of the package name: train/validation/test rows "
            + ", ".join(f"{name} {sum(c.values())} ({json.dumps(c)})" for name, c in prepared["counts"].items())
            + "; majority-class rate: "
            + ", ".join(f"{name} {m:.4f}" for name, m in prepared["majority"].items()) + ".",
            f"- Pretraining corpus: {prepared['domain_rows']} texts; **{prepared['dedupe_removed']} removed** because "
            "their normalized text (NFKC, case-folded, whitespace collapsed) is a validation or test text.", ""]

    # provenance
    commands = sorted({r["command"] for r in lines} | ({selection["command"]} if selection else set()))
    commits = sorted({r["git_commit"][:12] + (" (uncommitted changes)" if r["git_dirty"] else "") for r in lines})
    versions = sorted({json.dumps(r["versions"], sort_keys=True) for r in lines})
    hardware = sorted({json.dumps(r["hardware"], sort_keys=True) for r in lines})
    out += ["### Provenance", "",
            f"- Prepare: `{prepared['command']}` ({prepared['seconds']['total'] / 60:.1f} min); run: "
            + "; ".join(f"`{c}`" for c in commands),
            "- Git commit(s): " + ", ".join(f"`{c}`" for c in commits),
            "- Versions: " + "; ".join(", ".join(f"{k} {v}" for k, v in json.loads(v).items()) for v in versions),
            "- Hardware: " + "; ".join(", ".join(f"{k}: {v}" for k, v in json.loads(h).items()) for h in hardware),
            "- sha256: " + ", ".join(f"{k} `{v[:16]}`" for k, v in prepared["sha256"].items())
            + f", warmed MLM head `{prepared['warm_sha256'][:16]}`, "
            + ", ".join(f"{name} {k} `{v[:16]}`" for name, d in prepared["datasets"].items() for k, v in d.items()),
            f"- Model: `{prepared['model']}`. Fine-tuning: {json.dumps(first['finetune'])}. "
            f"Pretraining: {json.dumps({k: first['pretraining']['config'][k] for k in ('total_steps', 'batch_size', 'learning_rate', 'warmup_steps')}) if first.get('pretraining') else '–'}.",
            "", "Wall time per arm (s, mean over seeds; pretrain + held-out losses + fine-tune):", "",
            "| arm | runs | pretrain | held-out losses | fine-tune | total |", "|---|---:|---:|---:|---:|---:|"]
    for arm in arms:
        runs = [r for r in lines if r["arm"] == arm]
        cell = lambda k, runs=runs: num(float(np.mean([r["seconds"].get(k, 0.0) for r in runs])), 0)  # noqa: E731
        out.append(f"| `{arm}` | {len(runs)} | {cell('pretrain')} | {cell('intrinsic')} | {cell('finetune')} "
                   f"| {cell('total')} |")
    total = sum(r["seconds"]["total"] for r in lines) + (sum(g["seconds"] for g in selection["grid"]) if selection else 0)
    out += ["", f"Run time summed over runs {total / 60:.1f} min (arms and hyperparameter selection; runs in parallel "
            "processes overlap) + prepare "
            f"{prepared['seconds']['total'] / 60:.1f} min.", ""]

    # every run
    out += ["### Every run", "", "| arm | seed | test accuracy | test macro-F1 | validation macro-F1 | best epoch "
            "| MLM loss (random) | MLM loss (own) | s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(lines, key=lambda r: (arms.index(r["arm"]), r["seed"])):
        out.append(f"| `{r['arm']}` | {r['seed']} | {r['test']['accuracy']:.4f} | {r['test']['macro_f1']:.4f} | "
                   f"{r['validation']['macro_f1']:.4f} | {r['best_epoch']} | {num(r['intrinsic']['random'])} | "
                   f"{num(r['intrinsic']['own'])} | {r['seconds']['total']:.0f} |")
    out.append("")
    plot_downstream(lines, majority, classes, plots / f"downstream-{config_name}-{chash}.png", title)
    plot_intrinsic(lines, plots / f"intrinsic-{config_name}-{chash}.png", title)
    return out


def write_report(results: Path, report: Path) -> None:
    """REPORT.md from every line of `results`; plots next to the results file."""
    if not results.exists():
        raise SystemExit(f"{results} does not exist: run `run.py run` first")
    experiments, selections = load(results)
    plots = results.parent
    rel = lambda p: Path(os.path.relpath(Path(p).resolve(), report.resolve().parent)).as_posix()  # noqa: E731
    lines = ["# Does difference masking beat random masking?", "",
             f"Generated by `benchmarks/effect/run.py report` from every line of `{rel(results)}` "
             "(nothing here is written by hand). Each experiment (config hash) is reported on its own, largest "
             "first: the positive control, the power, the paired table, the held-out losses, then what it can "
             "conclude and how to rerun it.", ""]
    for chash, arm_lines in sorted(experiments.items(), key=lambda kv: -len(kv[1])):
        lines += experiment_section(chash, arm_lines, selections.get(chash), plots, rel)
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")

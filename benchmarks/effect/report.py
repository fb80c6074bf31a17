"""REPORT.md of the finished issue-38 run, generated from every line of results/results.jsonl
(`python -m benchmarks.effect.report`). The harness that wrote those lines is in git before issue 50;
`maskstream evaluate` replaced it, with its own report (maskstream/evaluate/report.py).

Lines are grouped by config hash (config values, inputs and splits, tokenizer, the general model's
training inputs and the TAPT passes). Statistics are over seeds, paired by seed
(maskstream.evaluate.statistics). Each report section is one function below, in the order the report
shows them.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.effect.configs import (
    ARMS,
    BASELINE,
    BOOTSTRAP_RESAMPLES,
    CONFIGS,
    CONTROL,
    MIN_SEEDS,
    PRIMARY_COMPARISON,
    PRIMARY_METRIC,
)
from maskstream.evaluate.report import ci, num, pts
from maskstream.evaluate.statistics import ALPHA, POWER, bootstrap_difference, holm, mean_sd, paired_summary

ARM_ORDER = list(ARMS)
METRIC = {"macro_f1": "macro-F1", "accuracy": "accuracy"}[PRIMARY_METRIC]
PRIMARY = f"probe test {METRIC}"
SCOPE = ("**What the intervals cover.** The t-intervals, Wilcoxon and Holm p-values are over TAPT seeds (each "
         "seed draws its own TAPT data order and masks), for **one** general model, **one** task and **one** test "
         "set. The bootstrap interval resamples the test texts with the seeds held fixed: how much the difference "
         "owes to this test set. Neither covers another general model, another task or another corpus.")


def pct(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.2f}"


def interval(c: dict[str, Any]) -> str:
    return ci(c["ci"])


def load(results: Path) -> dict[str, list[dict[str, Any]]]:
    """kind -> lines; for `arm` and `finetune`, the last line of each (config hash, arm, seed)."""
    kinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    last: dict[tuple, dict[str, Any]] = {}
    for text in results.read_text(encoding="utf-8").splitlines():
        if not text.strip():
            continue
        line = json.loads(text)
        if line["kind"] in ("arm", "finetune"):
            last[line["kind"], line["config_hash"], line["arm"], line["seed"]] = line
        else:
            kinds[line["kind"]].append(line)
    for (kind, *_), line in last.items():
        kinds[kind].append(line)
    return kinds


def arm_names(lines: list[dict[str, Any]]) -> list[str]:
    present = {r["arm"] for r in lines}
    return [a for a in ARM_ORDER if a in present] + sorted(present - set(ARM_ORDER))


def by_seed(lines: list[dict[str, Any]], arm: str, metric) -> dict[int, float]:
    return dict(sorted((r["seed"], metric(r)) for r in lines if r["arm"] == arm))


def probe_score(r: dict[str, Any], split: str = "test") -> float:
    """The primary metric of the probe on `split`."""
    return r["probe"][split][PRIMARY_METRIC]


def test_predictions(lines: list[dict[str, Any]], arm: str) -> dict[int, list[str]]:
    return {r["seed"]: r["probe"]["test"]["predictions"] for r in lines
            if r["arm"] == arm and "predictions" in r["probe"]["test"]}


def bootstrap(lines: list[dict[str, Any]], labels: list[str] | None, arm: str, base: str) -> dict[str, Any] | None:
    """bootstrap_difference of `arm` - `base` over test texts; None without the test labels."""
    a, b = test_predictions(lines, arm), test_predictions(lines, base)
    if not labels or not a or any(len(p) != len(labels) for p in [*a.values(), *b.values()]):
        return None
    return bootstrap_difference(labels, a, b, BOOTSTRAP_RESAMPLES)


def boot_interval(b: dict[str, Any] | None) -> str:
    return "–" if b is None or math.isnan(b["ci"][0]) else f"[{100 * b['ci'][0]:+.2f}, {100 * b['ci'][1]:+.2f}]"


def hardware(h: dict[str, Any]) -> str:
    return (f"{h['cpu']}, {h['cpu_count']} cores, {h['torch_threads']} thread(s)"
            f"{', ' + h['gpu'] if h.get('gpu') else ''}, load {h.get('load_average_at_start')}")


# --- sections -----------------------------------------------------------------------------------


def section_status(config_name: str, lines: list[dict[str, Any]]) -> list[str]:
    """Whether the run is complete: every required arm for every seed of the config."""
    planned = CONFIGS.get(config_name, {}).get("seeds", [])
    # the arms the gate and the primary comparison need, and every arm run so far
    needed = dict.fromkeys([*CONTROL, *PRIMARY_COMPARISON, *arm_names(lines)])
    arms = list(needed)
    done = {(r["arm"], r["seed"]) for r in lines}
    missing = [(a, s) for s in planned for a in arms if (a, s) not in done]
    complete = {s for s in planned if all((a, s) in done for a in arms)}
    if missing or len(complete) < len(planned):
        return [f"**Status: IN PROGRESS / INCOMPLETE.** {len(complete)} of {len(planned)} planned seeds have every "
                f"arm ({len(lines)} arm runs so far); the figures below are over the seeds done and will change as "
                "the run appends lines.", ""]
    return [f"**Status: complete** ({len(planned)} seeds × {len(arms)} arms).", ""]


def section_design(prepared: dict[str, Any], selection: dict[str, Any] | None, pilot: dict[str, Any] | None,
                   first: dict[str, Any]) -> list[str]:
    """The general model, the cleaning counts and every choice made before the arms ran."""
    g, c = prepared["general_model"], prepared["cleaning"]
    shape = g["shape"]
    out = ["### Design and what was chosen before the arms ran", "",
           f"- **General model** (`{g['key']}`): BERT-shaped, {shape['num_hidden_layers']} layers, hidden "
           f"{shape['hidden_size']}, {g['parameters']:,} parameters, MiniLM's WordPiece vocabulary "
           f"({prepared['tokenizer']['package']} {prepared['tokenizer']['version']}); pretrained from scratch with "
           f"random masking for {g['settings']['steps']} steps of {g['settings']['batch_size']} × {g['max_length']} "
           f"tokens ({g['passes']:.1f} passes over {g['rows']['train']} rows of general text) in "
           f"{g['seconds'] / 60:.1f} min. **Held-out masked-token accuracy {pct(g['held_out']['accuracy'])} %** "
           f"(loss {g['held_out']['loss']:.3f} nats; {pct(g['held_out_before']['accuracy'])} % before training, "
           f"{g['held_out']['masked_tokens']:,} masked tokens).",
           f"- **Splits by near-duplicate cluster** (word-trigram Jaccard ≥ {c['threshold']} over the whole text or its "
           f"first 32 words): {c['labeled_rows']} labeled texts in {c['clusters']} clusters "
           f"({c['texts_in_clusters_of_2_or_more']} texts share a cluster, the largest has {c['largest_cluster']}); "
           "rows " + ", ".join(f"{name} {sum(v.values())}" for name, v in prepared["counts"].items()) + ".",
           f"- **Pretraining corpora cleaned**: {c['tapt_removed']} TAPT texts and {c['general_removed']} general texts "
           "removed because they are, or nearly duplicate, a validation or test text, leaving "
           f"{c['tapt_rows']} and {c['general_rows']}. Validation/test texts with a near-duplicate after cleaning: "
           + ", ".join(f"{k} {v}" for k, v in c["held_out_with_near_duplicate_after"].items()) + ".",
           f"- **TAPT**: {first['pretraining']['steps'] if first.get('pretraining') else '–'} steps "
           f"({first['passes']:g} passes over the TAPT corpus), the same steps, learning rate and data order for every "
           "arm of a seed." if first.get("passes") else "- **TAPT**: none in these lines."]
    if pilot:
        out.append(f"- **Pilot** (validation only): {pilot['rule']} Validation gains random − none by passes: "
                   + ", ".join(f"{p}: {pts(v)} points" for p, v in pilot["gains"].items())
                   + f"; chosen **{pilot['passes']:g} passes**" + (" (no candidate gained)" if pilot["no_gain"] else "")
                   + ".")
    if selection:
        out.append(f"- **Probe**: {selection['rule']} Validation {METRIC} by C: "
                   + ", ".join(f"{row['C']:g}: {pct(row[PRIMARY_METRIC])} %" for row in selection["grid"])
                   + f"; chosen **C = {selection['chosen_C']:g}**.")
    out.append(f"- **Statistics, fixed in `configs.py` before any arm ran**: primary metric the probe's test {METRIC} "
               "(the probe weighs classes equally, so accuracy would reward the majority class); split by "
               "near-duplicate cluster, stratified by label; the gate (section 1) needs every planned seed, at least "
               f"{MIN_SEEDS}, and a 95 % t-interval of `{CONTROL[0]}` − `{CONTROL[1]}` above zero; one primary "
               f"comparison, `{PRIMARY_COMPARISON[0]}` − `{PRIMARY_COMPARISON[1]}`; every other arm secondary, its "
               f"p-value Holm-adjusted; a bootstrap over test texts ({BOOTSTRAP_RESAMPLES} resamples) beside each "
               "interval.")
    out += [f"- Test set: {sum(prepared['counts']['test'].values())} texts; majority-class accuracy "
            f"{pct(prepared['majority']['test'])} %.", ""]
    return out


def control_passes(lines: list[dict[str, Any]], planned: list[int]) -> tuple[bool, dict[str, Any], str]:
    """The downstream gate, decided before any arm ran: random − none on the primary metric over every planned
    seed (at least MIN_SEEDS), with a spread, and a 95 % t-interval above zero. Returns (passed, summary, why)."""
    c = paired_summary(by_seed(lines, CONTROL[0], probe_score), by_seed(lines, CONTROL[1], probe_score))
    missing = sorted(set(planned) - set(c["seeds"]))
    if missing or c["n"] < MIN_SEEDS:
        return False, c, (f"the gate needs every planned seed ({len(planned)}) and at least {MIN_SEEDS}; "
                          f"{c['n']} are paired" + (f", seeds {missing} missing" if missing else ""))
    if not c["sd"] > 0:
        return False, c, "the paired differences have no spread (sd 0), so there is no interval"
    if c["ci"][0] > 0:
        return True, c, "the interval is above zero"
    return False, c, "the interval is not above zero"


def section_control(lines: list[dict[str, Any]], planned: list[int], labels: list[str] | None) -> list[str]:
    out = ["### 1. Positive control, downstream: does TAPT with random masking beat none?", ""]
    arms = arm_names(lines)
    if not all(a in arms for a in CONTROL):
        return out + ["The control needs the `none` and `random` arms; these lines lack one, so nothing is compared.",
                      ""]
    passed, c, why = control_passes(lines, planned)
    out.append(f"Random − none, {PRIMARY}: **{pts(c['mean'])} points**, 95 % t-interval **{interval(c)}**, "
               f"Wilcoxon p {num(c['p_wilcoxon'])}, n = {c['n']} seeds, minimum detectable effect {pct(c['mde'])} "
               f"points ({POWER:.0%} power, α = {ALPHA}); bootstrap over test texts "
               f"{boot_interval(bootstrap(lines, labels, *CONTROL))}: the control "
               + (f"**PASSES** ({why})." if passed else f"**NOT DECIDED** ({why})." if "gate needs" in why
                  else f"**FAILS** ({why})."))
    if "gate needs" in why:
        out += ["", "**Not decided yet: nothing is compared until every planned seed is in** (the per-run table "
                "below is there for the record)."]
    elif not passed:
        out += ["", "**The control failed: the setup cannot show a masking strategy's effect downstream, so this "
                "experiment compares nothing** (the per-run table below is there for the record)."]
    return out + ["", SCOPE, ""]


def comparisons(lines: list[dict[str, Any]], labels: list[str] | None) -> dict[str, dict[str, Any]]:
    """Every arm but the baseline and `none` (the control's) against the baseline, paired by seed, with its
    bootstrap over test texts; the secondary arms (all but PRIMARY_COMPARISON's) Holm-adjusted as one family."""
    base = by_seed(lines, BASELINE, probe_score)
    out = {}
    for arm in arm_names(lines):
        if arm in (BASELINE, *CONTROL):
            continue
        out[arm] = paired_summary(by_seed(lines, arm, probe_score), base) | {
            "primary": arm == PRIMARY_COMPARISON[0], "bootstrap": bootstrap(lines, labels, arm, BASELINE)}
    adjusted = holm({arm: c["p_t"] for arm, c in out.items() if not c["primary"]})
    for arm, c in out.items():
        c["p_holm"] = c["p_t"] if c["primary"] else adjusted[arm]
    return out


def verdict(c: dict[str, Any]) -> str:
    low, high = c["ci"]
    if math.isnan(low):
        return "no interval"
    if low > 0:
        return "**better than random**"
    if high < 0:
        return "**worse than random**"
    return f"no difference detected (an effect under {pct(c['mde'])} points could hide here)"


def section_comparisons(lines: list[dict[str, Any]], planned: list[int], labels: list[str] | None) -> list[str]:
    """The primary comparison and the secondary ones; only when the control passed."""
    out = ["### 2. Every arm against `random` (primary readout)", ""]
    passed, _, _ = control_passes(lines, planned)
    if not passed:
        return out + ["Not compared: the control has not passed.", ""]
    rows = comparisons(lines, labels)
    primary = rows.get(PRIMARY_COMPARISON[0])
    if primary is not None:
        out += [f"**Primary comparison** (the only confirmatory test, decided before any arm ran): "
                f"`{PRIMARY_COMPARISON[0]}` − `{PRIMARY_COMPARISON[1]}`, {PRIMARY}: **{pts(primary['mean'])} points**, "
                f"95 % t-interval **{interval(primary)}**, paired t p {num(primary['p_t'])}: {verdict(primary)}.", ""]
    out += [f"Δ = arm − random, {PRIMARY}, percentage points, mean over seeds; 95 % t-interval over seeds; Wilcoxon "
            "signed-rank p (two-sided, exact); p (paired t), Holm-adjusted over the secondary arms (the primary one "
            f"unadjusted); MDE: the true Δ this design finds with {POWER:.0%} power at α = {ALPHA} given the observed "
            f"sd of the paired differences; bootstrap: 95 % percentile interval over {BOOTSTRAP_RESAMPLES} resamples "
            "of the test texts, seeds fixed.", "",
            f"| arm | role | seeds | {METRIC} (mean ± sd) | Δ vs random | 95 % CI | Wilcoxon p | p (Holm) | MDE "
            "| bootstrap 95 % |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in arm_names(lines):
        values = by_seed(lines, arm, probe_score)
        m, s = mean_sd(list(values.values()))
        row = [f"`{arm}`", "", str(len(values)), f"{pct(m)} ± {pct(s)}"]
        if arm in rows:
            c = rows[arm]
            row[1] = "primary" if c["primary"] else "secondary"
            row += [pts(c["mean"]), interval(c), num(c["p_wilcoxon"]), num(c["p_holm"]), pct(c["mde"]),
                    boot_interval(c["bootstrap"])]
        else:
            row[1] = "baseline" if arm == BASELINE else "control"
            row += ["–"] * 6
        out.append("| " + " | ".join(row) + " |")
    return out + [""]


def section_secondary(finetune: list[dict[str, Any]], selection: dict[str, Any] | None, prepared: dict[str, Any]
                      ) -> list[str]:
    out = ["### 3. Secondary readout: full fine-tuning", "",
           f"Max length {prepared['finetune_max_length']} tokens, covering "
           f"{pct(prepared['finetune_length_coverage'])} % of the labeled texts.", ""]
    if selection:
        out.append(f"{selection['rule']} Mean validation macro-F1 by learning rate: "
                   + ", ".join(f"{g['learning_rate']:g}: {pct(g['validation_macro_f1'])} %" for g in selection["grid"])
                   + f"; chosen **{selection['chosen_learning_rate']:g}**.")
        out.append("")
    if not finetune:
        return out + ["No fine-tuning lines yet (it runs after the probe run: `run --readout finetune`).", ""]
    base = by_seed(finetune, BASELINE, lambda r: r["test"][PRIMARY_METRIC])
    out += [f"| arm | seeds | test {METRIC} (mean over fine-tuning seeds, then seeds) | Δ vs random | 95 % CI |",
            "|---|---:|---:|---:|---:|"]
    for arm in arm_names(finetune):
        values = by_seed(finetune, arm, lambda r: r["test"][PRIMARY_METRIC])
        c = paired_summary(values, base)
        out.append(f"| `{arm}` | {len(values)} | {pct(mean_sd(list(values.values()))[0])} | "
                   + (f"{pts(c['mean'])} | {interval(c)} |" if arm != BASELINE else "(baseline) | – |"))
    return out + [""]


def section_runs(lines: list[dict[str, Any]]) -> list[str]:
    """Every run with its wall time and the hardware it ran on."""
    out = ["### Every run: wall time per arm and seed, hardware", "",
           f"| arm | seed | probe validation {METRIC} | probe test {METRIC} | probe test acc. | TAPT held-out MLM acc. "
           "| TAPT s | probe s | total s | hardware |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    arms = arm_names(lines)
    for r in sorted(lines, key=lambda r: (r["seed"], arms.index(r["arm"]))):
        held = r["pretraining"]["held_out"]["accuracy"] if r.get("pretraining") and r["pretraining"]["held_out"] else None
        out.append(f"| `{r['arm']}` | {r['seed']} | {pct(probe_score(r, 'validation'))} | {pct(probe_score(r))} | "
                   f"{pct(r['probe']['test']['accuracy'])} | {pct(held)} | {r['seconds']['tapt']:.0f} | {r['seconds']['probe']:.0f} | "
                   f"{r['seconds']['total']:.0f} | {hardware(r['hardware'])} |")
    return out + [""]


def section_provenance(lines: list[dict[str, Any]], prepared: dict[str, Any]) -> list[str]:
    commits = sorted({r["git_commit"][:12] + (" (uncommitted changes)" if r["git_dirty"] else "") for r in lines})
    versions = sorted({json.dumps(r["versions"], sort_keys=True) for r in lines})
    commands = sorted({r["command"] for r in lines})
    return ["### Provenance", "",
            "- Inputs: " + json.dumps(prepared["inputs"]) + "; sha256 of the prepared files: "
            + ", ".join(f"{k} `{v[:16]}`" for k, v in prepared["sha256"].items()) + ".",
            "- Commands: " + "; ".join(f"`{c}`" for c in commands),
            "- Git commit(s): " + ", ".join(f"`{c}`" for c in commits),
            "- Versions: " + "; ".join(", ".join(f"{k} {v}" for k, v in json.loads(v).items()) for v in versions), ""]


def section_pilot(base: str, pilot_lines: list[dict[str, Any]], choice: dict[str, Any] | None) -> list[str]:
    """The pilot's runs (validation only; their seeds are not in the main run)."""
    out = [f"## Pilot for prepared data `{base}`" + ("" if choice else " (no choice recorded: in progress, or stopped)"), "",
           f"| arm | seed | TAPT passes | probe validation {METRIC} | TAPT s | probe s | total s | hardware |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in sorted(pilot_lines, key=lambda r: (r["seed"], r["passes"], r["arm"])):
        out.append(f"| `{r['arm']}` | {r['seed']} | {r['passes']:g} | {pct(probe_score(r, 'validation'))} | "
                   f"{r['seconds']['tapt']:.0f} | {r['seconds']['probe']:.0f} | {r['seconds']['total']:.0f} | "
                   f"{hardware(r['hardware'])} |")
    if choice:
        out += ["", f"Chosen: {choice['passes']:g} passes (rule: {choice['rule']})"]
    first = next((r for r in pilot_lines if r.get("pretraining")), pilot_lines[0])
    return out + [""] + section_design(first["prepared"], None, choice, first)


def section_splits(line: dict[str, Any]) -> list[str]:
    """Splits and cleaned corpora of a `prepare` still building its datasets and general model."""
    c = line["cleaning"]
    return [f"## `{line['config_name']}`: prepare IN PROGRESS (splits done; datasets and general model being built)",
            "", f"- {c['labeled_rows']} labeled texts in {c['clusters']} near-duplicate clusters (word-trigram Jaccard "
            f">= {c['threshold']} over the whole text or its first 32 words; {c['texts_in_clusters_of_2_or_more']} texts "
            f"share a cluster, the largest has {c['largest_cluster']}); rows "
            + ", ".join(f"{name} {sum(v.values())}" for name, v in line["counts"].items()) + ".",
            f"- Removed because they are, or nearly duplicate, a validation or test text: {c['tapt_removed']} TAPT texts, "
            f"{c['general_removed']} general texts (left: {c['tapt_rows']} and {c['general_rows']}). Validation/test "
            "texts with a near-duplicate after cleaning: "
            + ", ".join(f"{k} {v}" for k, v in c["held_out_with_near_duplicate_after"].items()) + ".",
            f"- Hardware: {hardware(line['hardware'])}; command `{line['command']}`.", ""]


def experiment_sections(chash: str, lines: list[dict[str, Any]], kinds: dict[str, list[dict[str, Any]]]
                        ) -> list[str]:
    first = next((r for r in lines if r.get("pretraining")), lines[0])
    base = first["base_hash"]
    selection = next((s for s in kinds["probe_selection"] if s["base_hash"] == base), None)
    pilot = next((s for s in kinds["pilot_choice"] if s["base_hash"] == base), None)
    ft_selection = next((s for s in kinds["finetune_selection"] if s["base_hash"] == base), None)
    finetune = [r for r in kinds["finetune"] if r["config_hash"] == chash]
    labels = next((s["labels"] for s in kinds["test_labels"] if s["base_hash"] == base), None)
    planned = CONFIGS.get(first["config_name"], {}).get("seeds", [])
    return ([f"## Experiment `{first['config_name']}`, config hash `{chash}`", ""]
            + section_status(first["config_name"], lines)
            + section_control(lines, planned, labels) + section_comparisons(lines, planned, labels)
            + section_secondary(finetune, ft_selection, first["prepared"])
            + section_design(first["prepared"], selection, pilot, first)
            + section_runs(lines) + section_provenance(lines, first["prepared"]))


def write_report(results: Path, report: Path) -> None:
    """REPORT.md from every line of `results`."""
    if not results.exists():
        raise SystemExit(f"{results} does not exist: it holds the issue-38 run's lines")
    kinds = load(results)
    experiments: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in kinds["arm"]:
        experiments[line["config_hash"]].append(line)
    out = ["# Does difference masking beat random masking?", "",
           "Generated by `python -m benchmarks.effect.report` from every line of `results/results.jsonl` "
           "(nothing here is written by hand). Each experiment (config hash) is reported on its own: its status, "
           "the downstream control (the gate), the comparisons it allows, the secondary readout, the design and the "
           "choices made before the arms ran, every run with its wall time and hardware, provenance.", ""]
    if not experiments:
        out += ["**No main-run line yet: the run is IN PROGRESS.**", ""]
    for chash, lines in sorted(experiments.items(), key=lambda kv: -len(kv[1])):
        out += experiment_sections(chash, lines, kinds)
    pilots: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in kinds["pilot"]:
        pilots[line["base_hash"]].append(line)
    for base, pilot_lines in pilots.items():
        choice = next((s for s in kinds["pilot_choice"] if s["base_hash"] == base), None)
        out += section_pilot(base, pilot_lines, choice)
    prepared_splits = {json.dumps(line["prepared"]["sha256"], sort_keys=True) for line in kinds["prepared"]}
    for line in kinds["splits"]:
        if json.dumps(line["sha256"], sort_keys=True) not in prepared_splits:
            out += section_splits(line)
    started = set(pilots) | {line["base_hash"] for line in kinds["arm"]}
    for line in kinds["prepared"]:
        if line["base_hash"] not in started:
            out += [f"## Prepared data `{line['base_hash']}` (`{line['config_name']}`): no run finished yet", ""]
            out += section_design(line["prepared"], None, None, {})
    report.write_text("\n".join(out) + "\n", encoding="utf-8")


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    write_report(here / "results" / "results.jsonl", here / "REPORT.md")
    print(f"wrote {here / 'REPORT.md'}")

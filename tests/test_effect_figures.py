"""The figures README.md and the docs quote from benchmarks/effect/REPORT.md are copied by hand (issue 50).
Each one is recomputed here from benchmarks/effect/results/results.jsonl with the report's own code
(report.py, paired.py), in the report's format, and checked twice: the doc still says it (QUOTES) and the
committed report says the same (REPORT_LINES). Figures the report does not print (validation differences,
`background_sharpened` − `difference`, seed counts) are recomputed from the same lines, whose per-run
values REPORT.md lists. Editing a figure in a doc, or results that change the report, fails a test.

Text is compared after two normalizations: the docs' minus sign (U+2212) reads as '-', and any run of
whitespace as one space, so a quote may wrap across lines."""

from __future__ import annotations

import functools
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.effect import report
from maskstream.evaluate.statistics import mean_sd, paired_summary

REPO = Path(__file__).resolve().parents[1]
EFFECT = REPO / "benchmarks" / "effect"
RESULTS = EFFECT / "results" / "results.jsonl"
REPORT = EFFECT / "REPORT.md"
EXPERIMENT = "1eb63e91a24da70c"  # config `small`, 8 seeds x 4 arms: the run the docs quote


def normalized(text: str) -> str:
    return " ".join(text.replace("\u2212", "-").split())


@functools.cache
def read(relative: str) -> str:
    return normalized((REPO / relative).read_text(encoding="utf-8"))


def summary_figures(f: dict[str, str], name: str, c: dict[str, Any]) -> None:
    f[f"{name}_mean"] = report.pts(c["mean"])
    f[f"{name}_ci"] = report.interval(c)
    f[f"{name}_high"] = f"{100 * c['ci'][1]:+.2f}"
    f[f"{name}_wilcoxon"] = report.num(c["p_wilcoxon"])
    f[f"{name}_mde"] = report.pct(c["mde"])


@functools.cache
def figures() -> dict[str, str]:
    """Every quoted figure, by name, as report.py writes it."""
    kinds = report.load(RESULTS)
    lines = [r for r in kinds["arm"] if r["config_hash"] == EXPERIMENT]
    finetune = [r for r in kinds["finetune"] if r["config_hash"] == EXPERIMENT]
    assert lines and finetune, f"no lines of experiment {EXPERIMENT} in {RESULTS}"
    base = lines[0]["base_hash"]
    labels = next(s["labels"] for s in kinds["test_labels"] if s["base_hash"] == base)
    pilot = next(s for s in kinds["pilot_choice"] if s["base_hash"] == base)
    ft_selection = next(s for s in kinds["finetune_selection"] if s["base_hash"] == base)
    first = next(r for r in lines if r.get("pretraining"))
    prepared, general = first["prepared"], first["prepared"]["general_model"]
    cleaning = prepared["cleaning"]

    def probe(arm: str, other: str, split: str = "test") -> dict[str, Any]:
        return paired_summary(report.by_seed(lines, arm, lambda r: report.probe_score(r, split)),
                              report.by_seed(lines, other, lambda r: report.probe_score(r, split)))

    def fine(arm: str, other: str) -> dict[str, Any]:
        return paired_summary(*(report.by_seed(finetune, a, lambda r: r["test"][report.PRIMARY_METRIC])
                                for a in (arm, other)))

    f: dict[str, str] = {}
    compared = report.comparisons(lines, labels)  # with Holm's p and the bootstrap, as in the report
    for name, c in {"control": probe("random", "none"), "primary": compared["difference"],
                    "secondary": compared["background_sharpened"],
                    "sharpened_vs_difference": probe("background_sharpened", "difference"),
                    "primary_validation": probe("difference", "random", "validation"),
                    "secondary_validation": probe("background_sharpened", "random", "validation"),
                    "ft_control": fine("random", "none"), "ft_none": fine("none", "random"),
                    "ft_primary": fine("difference", "random"),
                    "ft_secondary": fine("background_sharpened", "random")}.items():
        summary_figures(f, name, c)
    f["primary_p"] = report.num(compared["difference"]["p_holm"])
    f["secondary_holm"] = report.num(compared["background_sharpened"]["p_holm"])
    f["primary_bootstrap"] = report.boot_interval(compared["difference"]["bootstrap"])
    f["secondary_bootstrap"] = report.boot_interval(compared["background_sharpened"]["bootstrap"])
    f["control_bootstrap"] = report.boot_interval(report.bootstrap(lines, labels, "random", "none"))
    f["primary_mde_1"] = f"{100 * compared['difference']['mde']:.1f}"
    f["sharpened_vs_difference_wilcoxon_2"] = f"{probe('background_sharpened', 'difference')['p_wilcoxon']:.2f}"
    f["ft_control_gap"] = f"{-100 * fine('random', 'none')['mean']:.2f}"
    f["primary_wins"] = str(sum(d > 0 for d in compared["difference"]["differences"]))
    f["seeds"] = str(compared["difference"]["n"])
    for arm in ("none", "random", "difference", "background_sharpened"):
        m, s = mean_sd(list(report.by_seed(lines, arm, report.probe_score).values()))
        f[f"{arm}_mean_sd"] = f"{report.pct(m)} ± {report.pct(s)}"
        ft = report.by_seed(finetune, arm, lambda r: r["test"][report.PRIMARY_METRIC])
        f[f"ft_{arm}"] = report.pct(mean_sd(list(ft.values()))[0])
        f[f"ft_{arm}_seeds"] = str(len(ft))
    f["ft_runs"] = str(statistics.mode(len(r["runs"]) for r in finetune))
    f["ft_max_length"] = str(prepared["finetune_max_length"])
    f["ft_coverage"] = report.pct(prepared["finetune_length_coverage"])
    f["ft_coverage_1"] = f"{100 * prepared['finetune_length_coverage']:.1f}"
    rate = ft_selection["chosen_learning_rate"]
    f["ft_lr"], f["ft_lr_report"] = re.sub(r"e-0*", "e-", f"{rate:.0e}"), f"{rate:g}"
    f["general_accuracy"] = report.pct(general["held_out"]["accuracy"])
    f["general_accuracy_1"] = f"{100 * general['held_out']['accuracy']:.1f}"
    f["general_steps"], f["general_steps_plain"] = f"{general['settings']['steps']:,}", str(general["settings"]["steps"])
    f["general_min"], f["general_min_1"] = f"{general['seconds'] / 60:.0f}", f"{general['seconds'] / 60:.1f}"
    f["passes"] = f"{pilot['passes']:g}"
    f["pilot_gains"] = ", ".join(report.pts(v) for v in pilot["gains"].values())
    f["pilot_passes"] = ", ".join(str(p) for p in pilot["gains"])
    f["pilot_gains_report"] = ", ".join(f"{p}: {report.pts(v)} points" for p, v in pilot["gains"].items())
    f["tapt_steps"], f["tapt_steps_plain"] = f"{first['pretraining']['steps']:,}", str(first["pretraining"]["steps"])
    rows = {name: sum(counts.values()) for name, counts in prepared["counts"].items()}
    f["train_rows"], f["train_rows_plain"] = f"{rows['train']:,}", str(rows["train"])
    f["validation_rows"], f["test_rows"] = str(rows["validation"]), str(rows["test"])
    f["held_out_rows"] = str(rows["validation"] + rows["test"])
    after = cleaning["held_out_with_near_duplicate_after"]
    f["held_out_left"] = str(sum(after.values()))
    f["held_out_left_report"] = ", ".join(f"{k} {v}" for k, v in after.items())
    f["max_total_min"] = f"{max(r['seconds']['total'] for r in lines) / 60:.0f}"
    f["probe_s_min"] = f"{min(r['seconds']['probe'] for r in lines):.0f}"
    f["probe_s_max"] = f"{max(r['seconds']['probe'] for r in lines):.0f}"
    f["runs_table"] = " ".join(report.section_runs(lines)[4:])  # every run's row, as the report prints it
    return f


# (file, what the file says, with {figure} where it quotes one)
QUOTES = [
    ("docs/evidence.md", "({held_out_left} of the {held_out_rows} validation and test texts keeps one)"),
    ("docs/evidence.md", "reaches {general_accuracy_1} % held-out masked-token accuracy"),
    ("docs/evidence.md", "the pilot chose {passes} TAPT passes (validation gains of random over none: {pilot_gains} "
                         "points at {pilot_passes} passes)"),
    ("docs/evidence.md", "| control: `random` − `none` | {control_mean} | {control_ci} | {control_wilcoxon} | – "
                         "| {control_mde} |"),
    ("docs/evidence.md", "| **primary**: `difference` (paper's map) − `random` | {primary_mean} | {primary_ci} "
                         "| {primary_wilcoxon} | {primary_p} (unadjusted) | {primary_mde} |"),
    ("docs/evidence.md", "| secondary: `background_sharpened` − `random` | {secondary_mean} | {secondary_ci} "
                         "| {secondary_wilcoxon} | {secondary_holm} | {secondary_mde} |"),
    ("docs/evidence.md", "| `background_sharpened` − `difference` (the defaults rule) | {sharpened_vs_difference_mean} "
                         "| {sharpened_vs_difference_ci} | {sharpened_vs_difference_wilcoxon_2} | – | – |"),
    ("docs/evidence.md", "its bootstrap over test texts, {control_bootstrap}, includes zero"),
    ("docs/evidence.md", "`difference` beats `random` on {primary_wins} of {seeds} seeds"),
    ("docs/evidence.md", "An effect under about {primary_mde_1} macro-F1 points could hide here (the MDE), and effects "
                         "up to the interval's upper bound, {primary_high} points, remain compatible with the data"),
    ("docs/evidence.md", "wider still ({primary_bootstrap} for the primary)"),
    ("docs/evidence.md", "seeds is {sharpened_vs_difference_mean} points against it, {sharpened_vs_difference_ci})"),
    ("docs/evidence.md", "`difference` − `random` {primary_mean} points on test, {primary_ci}, and "
                         "{primary_validation_mean} points on the probe's validation macro-F1, {primary_validation_ci}, "
                         "worse (`background_sharpened` − `random` on validation: {secondary_validation_mean}, "
                         "{secondary_validation_ci};"),
    ("docs/evidence.md", "(up to {max_total_min} min when beside other work; REPORT.md lists every run with its load), "
                         "{probe_s_min}-{probe_s_max} s per probe"),
    ("docs/evidence.md", "{seeds} seeds × {ft_runs} fine-tuning seeds, max length {ft_max_length} tokens, which covers "
                         "{ft_coverage_1} % of the labeled texts; learning rate {ft_lr} chosen"),
    ("docs/evidence.md", "Test macro-F1: `none` {ft_none}, `random` {ft_random}, `difference` {ft_difference}, "
                         "`background_sharpened` {ft_background_sharpened}."),
    ("docs/evidence.md", "TAPT with random masking is {ft_control_gap} points *below* no TAPT, {ft_control_ci}"),
    ("docs/evidence.md", "(`difference` {ft_primary_mean} against random, 95 % CI {ft_primary_ci}; "
                         "`background_sharpened` {ft_secondary_mean}, {ft_secondary_ci})"),
    ("docs/evidence.md", "with {train_rows} labeled texts"),
    ("docs/signal.md", "([docs/evidence.md](evidence.md), {seeds} seeds), passed its control (random − none "
                       "{control_mean} points, 95 % CI {control_ci})"),
    ("docs/signal.md", "`background_sharpened` − `difference` {sharpened_vs_difference_mean} points, "
                       "{sharpened_vs_difference_ci};"),
    ("docs/signal.md", "(`difference` − `random` {primary_mean}, {primary_ci}; `background_sharpened` − `random` "
                       "{secondary_mean}, {secondary_ci})"),
    ("docs/evidence.md", "beats none by {control_mean} macro-F1 points, 95 % CI {control_ci}, {seeds} seeds) but "
                         "not over the texts judged (bootstrap over test texts {control_bootstrap}), difference "
                         "masking scored {primary_mean} points over random masking on test, {primary_ci}: no "
                         "difference detected; on the probe's validation macro-F1 it scored "
                         "{primary_validation_mean} points, {primary_validation_ci}"),
    ("benchmarks/effect/README.md", "(for `small` the cap, {ft_max_length} tokens, covers only {ft_coverage_1} % of the "
                                    "labeled texts)"),
    ("benchmarks/effect/README.md", "The general model, {general_steps} steps, took {general_min} min"),
    ("benchmarks/effect/README.md", "The pilot chose {passes} TAPT passes ({tapt_steps} steps,"),
]

# the committed report's own lines that print the same figures
REPORT_LINES = [
    "Random − none, probe test macro-F1: **{control_mean} points**, 95 % t-interval **{control_ci}**, Wilcoxon p "
    "{control_wilcoxon}, n = {seeds} seeds, minimum detectable effect {control_mde} points (80% power, α = 0.05); "
    "bootstrap over test texts {control_bootstrap}: the control **PASSES**",
    "`difference` − `random`, probe test macro-F1: **{primary_mean} points**, 95 % t-interval **{primary_ci}**, "
    "paired t p {primary_p}: no difference detected (an effect under {primary_mde} points could hide here).",
    "| `difference` | primary | {seeds} | {difference_mean_sd} | {primary_mean} | {primary_ci} | {primary_wilcoxon} "
    "| {primary_p} | {primary_mde} | {primary_bootstrap} |",
    "| `background_sharpened` | secondary | {seeds} | {background_sharpened_mean_sd} | {secondary_mean} | {secondary_ci} "
    "| {secondary_wilcoxon} | {secondary_holm} | {secondary_mde} | {secondary_bootstrap} |",
    "Max length {ft_max_length} tokens, covering {ft_coverage} % of the labeled texts.",
    "; chosen **{ft_lr_report}**.",
    "| `none` | {ft_none_seeds} | {ft_none} | {ft_none_mean} | {ft_none_ci} |",
    "| `random` | {ft_random_seeds} | {ft_random} | (baseline) | – |",
    "| `difference` | {ft_difference_seeds} | {ft_difference} | {ft_primary_mean} | {ft_primary_ci} |",
    "| `background_sharpened` | {ft_background_sharpened_seeds} | {ft_background_sharpened} | {ft_secondary_mean} "
    "| {ft_secondary_ci} |",
    "random masking for {general_steps_plain} steps of",
    "in {general_min_1} min. **Held-out masked-token accuracy {general_accuracy} %**",
    "rows train {train_rows_plain}, validation {validation_rows}, test {test_rows}.",
    "Validation/test texts with a near-duplicate after cleaning: {held_out_left_report}.",
    "- **TAPT**: {tapt_steps_plain} steps ({passes} passes over the TAPT corpus)",
    "Validation gains random − none by passes: {pilot_gains_report}; chosen **{passes} passes**",
    "{runs_table}",
]


def missing(template: str, relative: str) -> str | None:
    """None when `relative` says `template` with the recomputed figures, else the text it should contain."""
    expected = normalized(template.format(**figures()))
    return None if expected in read(relative) else expected


@pytest.mark.slow
@pytest.mark.parametrize(("relative", "template"), QUOTES, ids=[f"{f}:{t[:40]}" for f, t in QUOTES])
def test_docs_quote_the_figures_the_results_give(relative: str, template: str) -> None:
    expected = missing(template, relative)
    assert expected is None, (f"{relative} no longer says {expected!r}: a figure there differs from what "
                              f"{RESULTS.relative_to(REPO)} gives, or the sentence changed (update QUOTES)")


@pytest.mark.parametrize("template", REPORT_LINES, ids=[t[:40] for t in REPORT_LINES])
def test_the_report_prints_the_same_figures(template: str) -> None:
    expected = missing(template, "benchmarks/effect/REPORT.md")
    assert expected is None, (f"REPORT.md lacks {expected[:300]!r}: regenerate it "
                              "(python -m benchmarks.effect.run report) or check results.jsonl")


def test_a_changed_figure_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: the primary interval's last digit changed in a doc is reported missing."""
    relative = "docs/evidence.md"
    template = next(t for f, t in QUOTES if f == relative and "{primary_ci}" in t)
    assert missing(template, relative) is None
    ci = figures()["primary_ci"]  # e.g. "[-0.45, +1.97]"
    changed = f"{ci[:-2]}{(int(ci[-2]) + 1) % 10}]"
    edited = read(relative).replace(ci, changed)
    assert edited != read(relative)
    monkeypatch.setattr(sys.modules[__name__], "read", lambda _: edited)
    assert missing(template, relative) is not None


CONFIRMATORY_REPORTS = {  # each pre-registered run's report, generated from its results.jsonl
    "issue 50": EFFECT / "results" / "confirmatory" / "REPORT.md",
    "issue 61": EFFECT / "results" / "sections" / "confirmatory" / "REPORT.md",
    "issue 76": EFFECT / "results" / "sections-english" / "confirmatory" / "REPORT.md",
}
DECISION = "**Decision:** "


def line_starting(report_path: Path, start: str) -> str:
    return next(line for line in report_path.read_text(encoding="utf-8").splitlines() if line.startswith(start))


def report_line(run: str, start: str) -> str:
    return line_starting(CONFIRMATORY_REPORTS[run], start)


@pytest.mark.slow
@pytest.mark.parametrize(("relative", "run"), [("README.md", "issue 61"), ("README.md", "issue 76"),
                                               ("docs/evidence.md", "issue 50"), ("docs/evidence.md", "issue 61"),
                                               ("docs/evidence.md", "issue 76")])
def test_the_docs_carry_the_confirmatory_runs_decision(relative: str, run: str) -> None:
    """The sentence the pre-registered rule gives (the confirmatory report's, generated from its results)
    is the one docs/evidence.md carries for every run and README.md for the runs that decided, issues 61 and 76
    (issue 74: the README gives the decisions, the history is in docs/evidence.md), once every planned seed is in."""
    sentence = normalized(report_line(run, DECISION)[len(DECISION):])
    unfinished = "interim" in sentence or re.match(r"Exploratory, no decision: \d+ seeds, and a decision needs", sentence)
    assert not unfinished, f"{run}'s confirmatory run is not finished: the docs quote no decision yet"
    assert sentence.rstrip(".") in read(relative).replace("**", ""), (relative, sentence)


def percent(share: str) -> str:
    """A share as the report prints it, `0.097 ± 0.004`, as the README says it, `9.7 ± 0.4 %`: the same digits."""
    value, error = share.split(" ± ")
    digits = max(0, len(value.split(".")[1]) - 2)
    return f"{100 * float(value):.{digits}f} ± {100 * float(error):.{digits}f} %"


def test_the_readme_gives_the_texts_and_seeds_shares_of_the_deciding_interval() -> None:
    """Issues 61 and 74: the README's sentence says how much of its interval comes from the texts and the
    seeds: the mean of the shares over 16 random streams of the report's bootstrap, with its Monte Carlo error
    (share_streams.json, benchmarks/effect/share_streams.py), whose stream 0 is the report's primary row."""
    import json
    import math

    from maskstream.evaluate.report import with_error

    streams = json.loads((EFFECT / "results/sections/confirmatory/share_streams.json").read_text(encoding="utf-8"))
    row = [cell.strip() for cell in report_line("issue 61", "| `difference − random` | primary |").split("|")]
    spread = streams["spread"]
    names = ("texts", "seeds", "seed_x_text")
    assert row[9] == " / ".join(with_error(spread[k]["stream_0"], spread[k]["stream_0_mc_error"]) for k in names)
    texts, seeds, interaction = (percent(with_error(spread[k]["mean"], spread[k]["sd"] / math.sqrt(streams["streams"])))
                                 for k in names)
    expected = (f"Of the interval's variance, {texts} comes from which texts were judged, {seeds} from the "
                f"seeds and {interaction} from their interaction (the mean over {streams['streams']} random "
                "streams of the bootstrap, ± its Monte Carlo error")
    assert normalized(expected) in read("README.md"), expected


def test_the_docs_give_the_general_english_runs_figures() -> None:
    """Issue 76: docs/evidence.md's row for the run from the general-English model carries its scores, control,
    difference − random and variance shares as its committed report prints them (all 5 planned seeds in), and
    the TAPT + probe seconds its lines record with the default pilot's (the budget counts all three); the
    README carries its control."""
    from benchmarks.effect.defaults_run import arm_lines
    from benchmarks.effect.ours import run_seconds

    path = CONFIRMATORY_REPORTS["issue 76"]
    folder = path.parent.parent
    scores = {arm: [cell.strip() for cell in line_starting(path, f"| `{arm}` |").split("|")][3]
              for arm in ("none", "random", "difference")}
    seeds, control_mean, control_ci = comparison(path, "random − none")
    _, primary_mean, primary_ci = comparison(path, "difference − random")
    cells = [cell.strip() for cell in report_line("issue 76", "| `difference − random` | primary |").split("|")]
    shares = cells[9]
    assert seeds == "5", f"issue 76's confirmatory run is not finished: {seeds} seeds"
    row = (f"| 5 | {scores['none']} | {scores['random']} | {scores['difference']} | {control_mean} {control_ci} "
           f"| {primary_mean} {primary_ci} | {shares} |")
    assert normalized(row) in read("docs/evidence.md"), row
    confirmatory = arm_lines(path.with_name("results.jsonl"))
    earlier = (EFFECT / "results" / "default-pilot" / "results.jsonl", folder / "pilot" / "results.jsonl")
    seconds = sum(map(run_seconds, confirmatory)) + sum(sum(map(run_seconds, arm_lines(file))) for file in earlier)
    assert normalized(f"{seconds / 3600:.2f} CPU-h (the default pilot") in read("docs/evidence.md"), seconds
    assert normalized(f"Cost: {seconds:,.0f} s of TAPT and probe, {seconds / 3600:.2f} CPU-hours") in read(
        "docs/evidence.md")
    # The prose beside the row: per-seed differences from the lines, the intervals and tests as the report prints them.
    lines = {(line["arm"], line["seed"]): line["macro_f1"] for line in confirmatory}
    per_seed = ", ".join(f"{100 * (lines[('difference', seed)] - lines[('random', seed)]):+.2f}" for seed in range(5))
    prose = (f"({per_seed} points for seeds 0–4, from the lines' scores). Seeds-only interval {cells[7]}, texts-only "
             f"interval {cells[8]}; the paired t-test over seeds p {cells[10]}; TOST within ±1 point p {cells[11]}; "
             f"P(difference − random > 0) in the bootstrap {cells[6]}.")
    assert normalized(prose) in read("docs/evidence.md"), prose
    # The README: the control and the shares, as the report prints them (one stream, ± its Monte Carlo error).
    assert normalized(f"random − none {control_mean} {control_ci}") in read("README.md")
    texts, seeds_share, interaction = (percent(share) for share in shares.split(" / "))
    expected = (f"Of the interval's variance, {texts} comes from which texts were judged, {seeds_share} from the "
                f"seeds and {interaction} from their interaction (the report's one stream of the bootstrap")
    assert normalized(expected) in read("README.md"), expected


DEFAULT_RUNS = EFFECT / "results" / "defaults-english"  # issue 74: `maskstream evaluate` at its defaults


def comparison(report_path: Path, name: str) -> tuple[str, str, str]:
    """(seeds, mean, hierarchical interval) of one row of a report's comparisons table, as printed."""
    cells = [cell.strip() for cell in line_starting(report_path, f"| `{name}` |").split("|")]
    return cells[3], cells[4], cells[5]


@pytest.mark.parametrize("task", ["shipped", "second"])
def test_the_docs_give_each_default_runs_control_contrast_and_cost(task: str) -> None:
    """Issue 74: docs/evidence.md's row for each default run carries its control and difference − random as
    the committed report prints them (every planned seed in) and the TAPT + probe seconds its lines record;
    the README carries the control."""
    from benchmarks.effect.defaults_run import arm_lines
    from benchmarks.effect.ours import run_seconds

    folder = DEFAULT_RUNS / task
    seeds, control_mean, control_ci = comparison(folder / "REPORT.md", "random − none")
    _, primary_mean, primary_ci = comparison(folder / "REPORT.md", "difference − random")
    assert seeds == "5", f"{task}'s default run is not finished: {seeds} seeds"
    seconds = sum(map(run_seconds, arm_lines(folder / "results.jsonl")))  # a run's cost: its lines' TAPT + probe
    row = (f"| {task} | {control_mean} {control_ci} | {primary_mean} {primary_ci} | {seconds:,.0f} s "
           f"({seconds / 3600:.1f} CPU-hours) |")
    assert normalized(row) in read("docs/evidence.md"), row
    assert normalized(f"random − none {control_mean} {control_ci}") in read("README.md")

"""The masking signal as people read it: the lines `maskstream build` and `inspect` print and the plots
of the tallies and figures that `maskstream.pipelines.dataset.core.signal_tallies` computes."""

from __future__ import annotations

import math
from typing import Any

import fsspec
import numpy as np

from maskstream.pipelines.dataset.core.signal_tallies import (
    FREQUENT_WORDS,
    TOP_WORDS,
    WordsForReport,
    merge_map_tallies,
)
from maskstream.pipelines.dataset.core.vocabulary import vocabulary_line


def shortfall_lines(shortfall: dict[str, Any] | None) -> list[str]:
    """The printout's budget-shortfall line, with what the loader does and the knob that closes it."""
    if not shortfall:
        return []
    if not shortfall["short_sequences"]:
        return [f"  budget: no sequence more than {shortfall['tolerance']:.0%} below its masking budget"]
    return [f"  budget shortfall: {shortfall['short_sequences']} of {shortfall['sequences']} sequences "
            f"({shortfall['short_share']:.1%}) are more than {shortfall['tolerance']:.0%} below their masking budget, "
            f"missing {shortfall['missing_masks']:.1f} expected masks ({shortfall['missing_share_of_their_budget']:.1%} "
            "of their budget): too few of their tokens have p > 0, and the loader masks those and never a token "
            "with p = 0; `maskstream build --floor 0.01` (any floor > 0) closes the gap"]


GROUP_LABELS = {"seed_words": "seed words", "similar_words": "top-1% similar", "stop_words": "stop words",
                "outside_words": "outside words"}


def format_report(report: dict[str, Any], title: str = "masking signal") -> list[str]:
    """Text lines of a `signal_report`."""
    lines = [f"{title}: {report['tokens']} tokens, {report['expected_masks']:.1f} expected masks, "
             f"entropy {report['entropy_ratio']:.3f} of uniform, largest budget error per sequence "
             f"{report['max_budget_error']:.1e}",
             f"  {'group':<16}{'tokens':>10}{'token share':>13}{'mask share':>12}{'lift':>8}"]
    for key, label in GROUP_LABELS.items():
        g = report["groups"][key]
        lines.append(f"  {label:<16}{g['tokens']:>10}{g['token_share']:>13.3f}{g['mask_share']:>12.3f}{g['lift']:>8.2f}")
    lines.append("  most expected masks: " + ", ".join(
        f"{r['word']} {r['expected_masks']:.0f}" for r in report["most_masked"]))
    lines.append("  frequent words, fewest masks per occurrence: " + ", ".join(
        f"{r['word']} {r['mean_probability']:.3f}" for r in report["frequent_least_masked"]))
    lines += shortfall_lines(report.get("budget_shortfall"))  # absent from manifests before issue 31
    if report.get("warning"):
        lines.append(f"  WARNING: {report['warning']}")
    return lines


def build_lines(diagnostics: dict[str, Any]) -> list[str]:
    """A manifest's diagnostics as text: the built map's report, then the comparison."""
    lines = format_report(diagnostics, f"masking signal of {diagnostics.get('map', 'the built map')}")
    if diagnostics.get("comparison"):
        lines += ["the same sequences under other maps (lift: share of expected masks / share of tokens):",
                  *comparison_lines({diagnostics.get("map", "built"): diagnostics, **diagnostics["comparison"]})]
    return lines


def same_figures(recomputed: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Do a recomputed report and a stored one (a manifest's diagnostics or one of its comparison
    entries) give the same lifts, shares, entropy ratio and budget error? Sums over batches and over
    shards differ in float rounding only."""
    def close(a: Any, b: Any) -> bool:
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)

    figures = [(recomputed.get(k), stored.get(k)) for k in ("entropy_ratio", "max_budget_error")]
    for key in GROUP_LABELS:
        mine, theirs = recomputed["groups"][key], stored.get("groups", {}).get(key, {})
        figures += [(mine.get(k), theirs.get(k)) for k in ("tokens", "token_share", "mask_share", "lift")]
    return all(close(a, b) for a, b in figures)


def inspect_lines(reports: dict[str, dict[str, Any]], manifest: Any) -> list[str]:
    """What `inspect` says of the vocabulary and the signal, given `reports` recomputed from the
    shards (`signal_reports`). A version whose writer printed them (its manifest
    holds the same figures) gets one line saying so, so that `build` then `inspect` shows each
    figure once; an older manifest, or figures that differ, get the whole report."""

    (built_name, built), *others = reports.items()
    stored = manifest.diagnostics
    compared = stored.get("comparison", {})
    if stored and same_figures(built, stored) and all(name in compared and same_figures(report, compared[name])
                                                      for name, report in others):
        return ["signal           the shards agree with the masking signal `maskstream build` printed "
                "(kept in manifest.json: vocabulary, diagnostics)"]
    lines = [*filter(None, [vocabulary_line(manifest.vocabulary)])]
    if stored:
        lines.append("NOTE: the shards' masking signal differs from the figures in the manifest; recomputed:")
    lines += format_report(built, f"masking signal of {built_name}")
    lines += ["the same corpus under other maps (lift: share of expected masks / share of tokens; entropy: of uniform):",
              *comparison_lines(reports)]
    return lines


def comparison_lines(reports: dict[str, dict[str, Any]]) -> list[str]:
    """One row per map: lifts, entropy ratio, the largest budget error and the share of sequences
    short of their budget."""
    width = max(len(name) for name in reports) + 2
    lines = [f"{'map':<{width}}{'seed lift':>10}{'top-1% lift':>12}{'stop lift':>10}{'outside lift':>13}"
             f"{'entropy':>9}{'budget err':>12}{'short seqs':>12}"]
    for name, r in reports.items():
        g = r["groups"]
        lines.append(f"{name:<{width}}{g['seed_words']['lift']:>10.2f}{g['similar_words']['lift']:>12.2f}"
                     f"{g['stop_words']['lift']:>10.2f}{g['outside_words']['lift']:>13.2f}"
                     f"{r['entropy_ratio']:>9.3f}{r.get('max_budget_error', float('nan')):>12.1e}"
                     f"{r.get('budget_shortfall', {}).get('short_share', float('nan')):>12.1%}")
    return lines


def plot_histograms(probabilities: Any, rates: Any, path: str, title: str) -> None:
    """Two histograms: the non-special tokens' mask probabilities and each sequence's expected masked fraction."""
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.hist(probabilities, bins=50, color="tab:blue")
    left.set_yscale("log")  # counts span decades; the label says the axis is not linear from zero
    left.set_xlabel("mask probability (non-special tokens)")
    left.set_ylabel("tokens (log scale)")
    right.hist(rates, bins=50, color="tab:orange")
    right.ticklabel_format(useOffset=False)
    right.set_ylim(bottom=0)
    right.set_xlabel("expected masked fraction per sequence")
    right.set_ylabel("sequences")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=30)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_report(report: dict[str, Any], path: str, title: str) -> None:
    """PNG: token vs mask shares per group, the probability histogram, the most masked words and
    the frequent words masked least. Every y axis starts at zero; word labels are rotated."""
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    shares, histogram, most, least = axes.flat
    labels = list(GROUP_LABELS.values())
    x = np.arange(len(labels))
    groups = [report["groups"][k] for k in GROUP_LABELS]
    shares.bar(x - 0.2, [g["token_share"] for g in groups], 0.4, label="share of tokens", color="#999999")
    shares.bar(x + 0.2, [g["mask_share"] for g in groups], 0.4, label="share of expected masks", color="#4c72b0")
    for xi, g in zip(x, groups, strict=True):
        shares.annotate(f"lift {g['lift']:.2f}", (xi, max(g["token_share"], g["mask_share"])), ha="center",
                        va="bottom", fontsize=9)
    shares.set_xticks(x, labels)
    shares.set_ylim(bottom=0)
    shares.set_ylabel("share")
    shares.legend()
    shares.set_title(f"entropy of the expected masks: {report['entropy_ratio']:.3f} of uniform")
    edges = np.asarray(report["histogram"]["edges"])
    histogram.bar(edges[:-1], report["histogram"]["counts"], width=np.diff(edges), align="edge", color="#4c72b0")
    histogram.set_ylim(bottom=0)
    histogram.set_xlabel("mask probability (non-special tokens)")
    histogram.set_ylabel("tokens")
    for ax, rows, key, ylabel in ((most, report["most_masked"], "expected_masks", "expected masks"),
                                  (least, report["frequent_least_masked"], "mean_probability",
                                   "expected masks per occurrence")):
        ax.bar(range(len(rows)), [r[key] for r in rows], color="#dd8452")
        ax.set_xticks(range(len(rows)), [r["word"] for r in rows], rotation=60, ha="right", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
    most.set_title(f"{TOP_WORDS} words with the most expected masks")
    least.set_title(f"{TOP_WORDS} of the {FREQUENT_WORDS} most frequent words with the fewest")
    fig.suptitle(title + (f"\nWARNING: {report['warning']}" if report.get("warning") else ""), fontsize=10)
    fig.tight_layout()
    with fsspec.open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def signal_reports(tallies: list[dict], word_table: Any, seeds: list[str]) -> dict[str, dict]:
    """`signal_report` per map of the shards' `maskstream.pipelines.dataset.inspect.signal.map_tallies` (one per shard):
    the stored probabilities first, then each map of `comparison_maps`, recomputed."""
    words = WordsForReport.of_table(word_table)  # once: it holds every word type's text and index
    return {name: words.diagnostics(tally, seeds) for name, tally in merge_map_tallies(tallies).items()}

"""Signal diagnostics: does a dataset's masking budget go to the words that make the domain
different, or is it spread almost uniformly?

A *tally* counts, over the non-special tokens of a dataset, the tokens and the expected masks
(the sum of their mask probabilities) of every word type, plus the tokens outside any word
(punctuation), a histogram of the probabilities and sum(p log p). Tallies of batches add up
(`merge_tallies`), so the build keeps one per batch and sums them. `signal_report` turns a
tally and the word table into the figures users read:

- share of tokens vs share of expected masks, and their ratio (the *lift*), for the seed words,
  the top 1 % most seed-similar other words, stop words (scikit-learn's English list) and
  tokens outside any word; lift 1 is what uniform masking gives;
- the entropy of the expected-mask distribution over tokens (P_i = p_i / sum p) relative to
  uniform (log of the number of tokens): 1 means uniform masking;
- the 30 words receiving the most expected masks, and, of the 500 most frequent words, the 30
  with the fewest expected masks per occurrence;
- a near-uniform warning (`NEAR_UNIFORM`) that names the knobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

HISTOGRAM_EDGES = np.linspace(0.0, 1.0, 51)
TOP_WORDS = 30
FREQUENT_WORDS = 500  # "frequent": the 500 word types with the most tokens
SIMILAR_FRACTION = 0.01
# Near-uniform when any holds: entropy ratio above 0.95, seed lift below 2, stop-word lift above 0.5.
NEAR_UNIFORM = {"entropy_ratio_above": 0.95, "seed_lift_below": 2.0, "stop_word_lift_above": 0.5}
# The comparison maps are recomputed on every k-th sequence only, k = max(1, sequences // this):
# 10,000 to 20,000 sequences whatever the corpus size, so their cost stays flat as it grows
# (all of them was a fifth of the build's per-token time besides the tokenizer).
COMPARISON_SEQUENCES = 10_000


def empty_tally(word_types: int) -> dict[str, np.ndarray]:
    return {
        "tokens": np.zeros(word_types, np.int64),  # non-special tokens of each word type
        "masks": np.zeros(word_types, np.float64),  # their expected masks (sum of p)
        "other": np.zeros(2, np.float64),  # tokens outside any word, their expected masks
        "histogram": np.zeros(len(HISTOGRAM_EDGES) - 1, np.int64),
        "sum_p_log_p": np.zeros(1, np.float64),
        "max_budget_error": np.zeros(1, np.float64),
    }


def budget_errors(special: np.ndarray, probability: np.ndarray, offsets: np.ndarray, budget: float) -> np.ndarray:
    """|sum(p) - budget * n| / (budget * n) of each sequence (n: its non-special tokens), from the
    stored float32 probabilities."""
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(len(lengths)), lengths)
    expected = np.bincount(row, weights=np.asarray(probability, np.float64), minlength=len(lengths))
    target = budget * np.bincount(row, weights=np.asarray(special) == 0, minlength=len(lengths))
    return np.abs(expected - target) / np.maximum(target, 1e-12)


def tally(word_index: np.ndarray, special: np.ndarray, probability: np.ndarray, word_types: int,
          offsets: np.ndarray, budget: float) -> dict[str, np.ndarray]:
    """The tally of a batch of sequences, flat: sequence i is `[offsets[i], offsets[i + 1])`."""
    errors = budget_errors(special, probability, offsets, budget)
    valid = np.asarray(special) == 0
    index = np.asarray(word_index, np.int64)[valid]
    p = np.asarray(probability, np.float64)[valid]
    known = index >= 0
    positive = p[p > 0]
    return {
        "tokens": np.bincount(index[known], minlength=word_types).astype(np.int64),
        "masks": np.bincount(index[known], weights=p[known], minlength=word_types),
        "other": np.array([(~known).sum(), p[~known].sum()], np.float64),
        "histogram": np.histogram(p, bins=HISTOGRAM_EDGES)[0].astype(np.int64),
        "sum_p_log_p": np.array([(positive * np.log(positive)).sum()]),
        "max_budget_error": np.array([errors.max(initial=0.0)]),
    }


def built_name(config: dict[str, Any]) -> str:
    return (f"built ({config.get('weighting')}, alpha {config.get('alpha')}, sharpness {config.get('sharpness', 1.0):g}, "
            f"floor {config.get('floor', 0.0):g})")


def comparison_maps(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Name -> `mask_probabilities_flat` options of the maps every build and `inspect` compare with
    the built one: the paper's similarity map, the reference code's rank map, the sharpened map."""
    from pipelines.dataset.mask_probability import PAPER_SHARPNESS, SHARPENED

    base = {"budget": config.get("budget", 0.15), "width": config.get("max_length", 0)}
    sharpened = {**base, **SHARPENED}
    return {
        f"paper (similarity, alpha 1, sharpness {PAPER_SHARPNESS:g})": {**base, "weighting": "similarity",
                                                                        "alpha": 1.0, "sharpness": PAPER_SHARPNESS},
        "reference (rank N - r, alpha 1)": {**base, "weighting": "rank", "alpha": 1.0},
        f"sharpened (sharpness {sharpened['sharpness']:g}, floor {sharpened['floor']:g})": sharpened,
    }


def comparison_stride(total_sequences: int) -> int:
    """k: the comparison maps are tallied on the sequences whose id is a multiple of k."""
    return max(1, total_sequences // COMPARISON_SEQUENCES)


def map_tallies(rows: Any, similarity: np.ndarray, config: dict[str, Any],
                total_sequences: int) -> dict[str, dict[str, np.ndarray]]:
    """Tallies of SEQUENCE_SCHEMA rows of a dataset of `total_sequences`: of their stored
    probabilities (`built_name`, first), and of each `comparison_maps` map recomputed from their
    words and `similarity`, on the rows `comparison_stride` picks (the same ones whoever reads them)."""
    import pyarrow as pa

    from pipelines.dataset.mask_probability import mask_probabilities_flat

    budget = config.get("budget", 0.15)

    def flat(table, name):
        return table.column(name).combine_chunks().flatten().to_numpy()

    def list_offsets(table):
        offsets = table.column("word_ids").combine_chunks().offsets.to_numpy().astype(np.int64)
        return offsets - offsets[0]

    tallies = {built_name(config): tally(flat(rows, "word_index"), flat(rows, "special_tokens_mask"),
                                         flat(rows, "mask_probability"), len(similarity), list_offsets(rows), budget)}
    stride = comparison_stride(total_sequences)
    compared = rows.filter(pa.array(rows.column("sequence_id").to_numpy() % stride == 0)) if stride > 1 else rows
    word_ids, word_index = flat(compared, "word_ids"), flat(compared, "word_index")
    special, offsets = flat(compared, "special_tokens_mask"), list_offsets(compared)
    for name, options in comparison_maps(config).items():
        p = mask_probabilities_flat(word_ids, word_index, special, offsets, similarity, **options)
        tallies[name] = tally(word_index, special, p, len(similarity), offsets, budget)
    return tallies


def merge_map_tallies(tallies: Iterable[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    tallies = list(tallies)
    return {name: merge_tallies([t[name] for t in tallies]) for name in tallies[0]}


def build_diagnostics(tallies: dict[str, dict[str, np.ndarray]] | None, word_table: Any,
                      seeds: Iterable[str]) -> dict[str, Any]:
    """A manifest's `diagnostics`: the built map's `dataset_diagnostics`, plus under `comparison`
    each compared map's lifts, entropy ratio and budget error."""
    if tallies is None:
        return {}
    seeds = list(seeds)
    (name, built), *others = tallies.items()
    report = {"map": name, **dataset_diagnostics(built, word_table, seeds), "comparison": {}}
    for other, counts in others:
        full = dataset_diagnostics(counts, word_table, seeds)
        report["comparison"][other] = {key: full[key] for key in ("groups", "entropy_ratio", "max_budget_error")}
    return report


def dataset_diagnostics(counts: dict[str, np.ndarray] | None, word_table: Any, seeds: Iterable[str]) -> dict[str, Any]:
    """A manifest's `diagnostics`: `signal_report` of a tally, with the word table (pyarrow,
    WORD_TABLE_SCHEMA) and scikit-learn's English stop words; {} without a tally (no rows)."""
    from pipelines.statistics.stop_words import ENGLISH_STOP_WORDS

    if counts is None:
        return {}
    index = word_table.column("word_index").to_numpy()
    words = np.empty(word_table.num_rows, object)
    words[index] = word_table.column("word").to_pylist()
    similarity = np.zeros(word_table.num_rows, np.float32)
    similarity[index] = word_table.column("similarity").to_numpy()
    return signal_report(counts, list(words), similarity, seeds, ENGLISH_STOP_WORDS)


def merge_tallies(tallies: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    tallies = list(tallies)
    merged = {key: value.copy() for key, value in tallies[0].items()}
    for other in tallies[1:]:
        for key in merged:
            if key == "max_budget_error":
                merged[key] = np.maximum(merged[key], other[key])
            else:
                merged[key] += other[key]
    return merged


def entropy_ratio(total_masks: float, sum_p_log_p: float, tokens: int) -> float:
    """H(P) / log(tokens) for P_i = p_i / S: H = log S - sum(p log p) / S."""
    if tokens <= 1 or total_masks <= 0:
        return 1.0
    return float((np.log(total_masks) - sum_p_log_p / total_masks) / np.log(tokens))


def _share(tokens: int, masks: float, total_tokens: int, total_masks: float) -> dict[str, float]:
    token_share = tokens / total_tokens if total_tokens else 0.0
    mask_share = masks / total_masks if total_masks else 0.0
    return {"tokens": int(tokens), "token_share": token_share, "mask_share": mask_share,
            "lift": mask_share / token_share if token_share else 0.0}


def signal_report(counts: dict[str, np.ndarray], words: Sequence[str], similarity: np.ndarray,
                  seeds: Iterable[str], stop_words: Iterable[str]) -> dict[str, Any]:
    """The figures of the module docstring, JSON-ready. `words[i]`, `similarity[i]`: word type i."""
    tokens, masks = counts["tokens"], counts["masks"]
    total_tokens = int(tokens.sum() + counts["other"][0])
    total_masks = float(masks.sum() + counts["other"][1])
    seeds, stop_words = set(seeds), set(stop_words)
    is_seed = np.fromiter((w in seeds for w in words), bool, len(words))
    is_stop = np.fromiter((w in stop_words for w in words), bool, len(words))
    present = np.flatnonzero((tokens > 0) & ~is_seed)
    # The top 1 % of the dataset's other word types by similarity (at least one).
    similar = present[np.argsort(-similarity[present], kind="stable")[: max(1, round(SIMILAR_FRACTION * len(present)))]]
    is_similar = np.zeros(len(words), bool)
    is_similar[similar] = True
    groups = {
        "seed_words": _share(tokens[is_seed].sum(), masks[is_seed].sum(), total_tokens, total_masks),
        "similar_words": _share(tokens[is_similar].sum(), masks[is_similar].sum(), total_tokens, total_masks),
        "stop_words": _share(tokens[is_stop].sum(), masks[is_stop].sum(), total_tokens, total_masks),
        "outside_words": _share(int(counts["other"][0]), counts["other"][1], total_tokens, total_masks),
    }
    ratio = entropy_ratio(total_masks, float(counts["sum_p_log_p"][0]), total_tokens)
    by_masks = np.lexsort((np.arange(len(words)), -masks))[:TOP_WORDS]
    frequent = np.lexsort((np.arange(len(words)), -tokens))[:FREQUENT_WORDS]
    frequent = frequent[tokens[frequent] > 0]
    rate = masks / np.maximum(tokens, 1)
    fewest = frequent[np.lexsort((frequent, rate[frequent]))][:TOP_WORDS]

    def word_rows(indices):
        return [{"word": words[i], "tokens": int(tokens[i]), "expected_masks": float(masks[i]),
                 "mean_probability": float(rate[i]), "similarity": float(similarity[i])} for i in indices]

    report = {
        "tokens": total_tokens,
        "expected_masks": total_masks,
        "groups": groups,
        "similar_words_count": int(len(similar)),
        "entropy_ratio": ratio,
        "max_budget_error": float(counts["max_budget_error"][0]),
        "most_masked": word_rows(by_masks),
        "frequent_least_masked": word_rows(fewest),
        "histogram": {"edges": HISTOGRAM_EDGES.tolist(), "counts": counts["histogram"].tolist()},
        "near_uniform_thresholds": dict(NEAR_UNIFORM),
    }
    report["warning"] = near_uniform_warning(report)
    return report


def near_uniform_warning(report: dict[str, Any]) -> str | None:
    """A sentence naming what is near-uniform and which knob to turn, or None."""
    seed_lift = report["groups"]["seed_words"]["lift"]
    stop_lift = report["groups"]["stop_words"]["lift"]
    reasons = []
    if report["entropy_ratio"] > NEAR_UNIFORM["entropy_ratio_above"]:
        reasons.append(f"entropy ratio {report['entropy_ratio']:.3f} > {NEAR_UNIFORM['entropy_ratio_above']}")
    if seed_lift < NEAR_UNIFORM["seed_lift_below"]:
        reasons.append(f"seed-word lift {seed_lift:.2f} < {NEAR_UNIFORM['seed_lift_below']}")
    if stop_lift > NEAR_UNIFORM["stop_word_lift_above"]:
        reasons.append(f"stop-word lift {stop_lift:.2f} > {NEAR_UNIFORM['stop_word_lift_above']}")
    if not reasons:
        return None
    return ("near-uniform masking signal (" + "; ".join(reasons) + "): masks fall almost where random masking "
            "puts them, so difference masking acts like random masking here; sharpen with `maskstream build "
            "--sharpness 8 --floor 0.01` (domain seeds: `maskstream stats --background-input FILE`)")


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


def comparison_lines(reports: dict[str, dict[str, Any]]) -> list[str]:
    """One row per map: lifts, entropy ratio and the largest budget error."""
    width = max(len(name) for name in reports) + 2
    lines = [f"{'map':<{width}}{'seed lift':>10}{'top-1% lift':>12}{'stop lift':>10}{'outside lift':>13}"
             f"{'entropy':>9}{'budget err':>12}"]
    for name, r in reports.items():
        g = r["groups"]
        lines.append(f"{name:<{width}}{g['seed_words']['lift']:>10.2f}{g['similar_words']['lift']:>12.2f}"
                     f"{g['stop_words']['lift']:>10.2f}{g['outside_words']['lift']:>13.2f}"
                     f"{r['entropy_ratio']:>9.3f}{r.get('max_budget_error', float('nan')):>12.1e}")
    return lines


def plot_report(report: dict[str, Any], path: str, title: str) -> None:
    """PNG: token vs mask shares per group, the probability histogram, the most masked words and
    the frequent words masked least. Every y axis starts at zero; word labels are rotated."""
    import fsspec
    import matplotlib

    matplotlib.use("Agg")
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

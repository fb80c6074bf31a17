"""Signal diagnostics: does a dataset's masking budget go to the words that make the domain
different, or is it spread almost uniformly?

A *tally* counts, over the non-special tokens of a dataset, the tokens and the expected masks
(the sum of their mask probabilities) of every word type present, plus the tokens outside any
word (punctuation), a histogram of the probabilities and sum(p log p). Tallies of batches add up
(`merge_tallies`), so the build keeps one per batch and sums them. A tally is sparse (the word
types present, sorted, with their counts), so a batch's costs what its words cost, not the
vocabulary: 16 bytes per type of the batch, whether the corpus has ten thousand types or ten million. `signal_report` turns a
tally and the word table into the figures users read:

- share of tokens vs share of expected masks, and their ratio (the *lift*), for the seed words,
  the top 1 % most seed-similar other words, stop words (scikit-learn's English list) and
  tokens outside any word; lift 1 is what uniform masking gives;
- the entropy of the expected-mask distribution over tokens (P_i = p_i / sum p) relative to
  uniform (log of the number of tokens): 1 means uniform masking;
- the 30 words receiving the most expected masks, and, of the 500 most frequent words, the 30
  with the fewest expected masks per occurrence;
- a near-uniform warning (`NEAR_UNIFORM`) that names the knobs;
- the budget shortfall (`budget_shortfall`): how many sequences have expected masks more than
  1 % below their budget, and the expected masks they miss, with the knob that closes the gap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from maskstream.pipelines.build.core.mask_probability import (
    PAPER_SHARPNESS,
    SHARPENED,
    mask_probabilities_flat,
)
from maskstream.pipelines.build.core.vocabulary import vocabulary_line
from maskstream.pipelines.statistics.stop_words import ENGLISH_STOP_WORDS

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
# A sequence is short of its budget when its expected masks sum(p) fall below (1 - this) * budget * n.
SHORTFALL_TOLERANCE = 0.01


def expected_and_budget(special: np.ndarray, probability: np.ndarray, offsets: np.ndarray,
                        budget: float) -> tuple[np.ndarray, np.ndarray]:
    """(sum(p), budget * n) of each sequence (n: its non-special tokens), from the stored float32
    probabilities, in float64."""
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(len(lengths)), lengths)
    expected = np.bincount(row, weights=np.asarray(probability, np.float64), minlength=len(lengths))
    target = budget * np.bincount(row, weights=np.asarray(special) == 0, minlength=len(lengths))
    return expected, target


SHORTFALL_KEYS = ("sequences", "short_sequences", "short_budget", "missing_masks")


def budget_shortfall(special: np.ndarray, probability: np.ndarray, offsets: np.ndarray,
                     budget: float) -> dict[str, np.ndarray]:
    """A tally (sums, mergeable by adding) of a batch's sequences short of their budget: sequences,
    short_sequences (sum(p) below (1 - SHORTFALL_TOLERANCE) * budget * n), short_budget (their
    budget * n) and missing_masks (their budget * n - sum(p): the expected masks no draw can make,
    since only tokens with p > 0 are ever masked). A sequence falls short when fewer than
    budget * n of its tokens have p > 0 (tokens outside words, words of similarity <= 0); any
    `--floor` > 0 gives every token p > 0 and closes the gap."""
    return shortfall_of(*expected_and_budget(special, probability, offsets, budget))


def shortfall_of(expected: np.ndarray, target: np.ndarray) -> dict[str, np.ndarray]:
    """`budget_shortfall` from each sequence's (sum(p), budget * n)."""
    short = expected < (1.0 - SHORTFALL_TOLERANCE) * target
    return {"sequences": np.array([float(len(target))]), "short_sequences": np.array([float(short.sum())]),
            "short_budget": np.array([target[short].sum()]),
            "missing_masks": np.array([(target[short] - expected[short]).sum()])}


def tally(word_index: np.ndarray, special: np.ndarray, probability: np.ndarray, offsets: np.ndarray,
          budget: float) -> dict[str, np.ndarray]:
    """The tally of a batch of sequences, flat: sequence i is `[offsets[i], offsets[i + 1])`."""
    expected, target = expected_and_budget(special, probability, offsets, budget)
    errors = np.abs(expected - target) / np.maximum(target, 1e-12)  # |sum(p) - budget * n| / (budget * n)
    valid = np.asarray(special) == 0
    index = np.asarray(word_index, np.int64)[valid]
    p = np.asarray(probability, np.float64)[valid]
    known = index >= 0
    positive = p[p > 0]
    words, inverse = np.unique(index[known], return_inverse=True)
    return {
        "words": words,  # the word types present (word_index), sorted; "tokens" and "masks" are theirs
        "tokens": np.bincount(inverse, minlength=len(words)).astype(np.int64),
        "masks": np.bincount(inverse, weights=p[known], minlength=len(words)),
        "other": np.array([(~known).sum(), p[~known].sum()], np.float64),
        "histogram": np.histogram(p, bins=HISTOGRAM_EDGES)[0].astype(np.int64),
        "sum_p_log_p": np.array([(positive * np.log(positive)).sum()]),
        "max_budget_error": np.array([errors.max(initial=0.0)]),
        **shortfall_of(expected, target),
    }


def built_name(config: dict[str, Any]) -> str:
    return (f"built ({config.get('weighting')}, alpha {config.get('alpha')}, sharpness {config.get('sharpness', 1.0):g}, "
            f"floor {config.get('floor', 0.0):g})")


def comparison_maps(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Name -> `mask_probabilities_flat` options of the maps every build and `inspect` compare with
    the built one: the paper's similarity map, the reference code's rank map, the sharpened map."""

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
    budget = config.get("budget", 0.15)

    def flat(table, name):
        return table.column(name).combine_chunks().flatten().to_numpy()

    def list_offsets(table):
        offsets = table.column("word_ids").combine_chunks().offsets.to_numpy().astype(np.int64)
        return offsets - offsets[0]

    tallies = {built_name(config): tally(flat(rows, "word_index"), flat(rows, "special_tokens_mask"),
                                         flat(rows, "mask_probability"), list_offsets(rows), budget)}
    stride = comparison_stride(total_sequences)
    compared = rows.filter(pa.array(rows.column("sequence_id").to_numpy() % stride == 0)) if stride > 1 else rows
    word_ids, word_index = flat(compared, "word_ids"), flat(compared, "word_index")
    special, offsets = flat(compared, "special_tokens_mask"), list_offsets(compared)
    for name, options in comparison_maps(config).items():
        p = mask_probabilities_flat(word_ids, word_index, special, offsets, similarity, **options)
        tallies[name] = tally(word_index, special, p, offsets, budget)
    return tallies


def merge_map_tallies(tallies: Iterable[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    tallies = list(tallies)
    return {name: merge_tallies([t[name] for t in tallies]) for name in tallies[0]}


def build_diagnostics(tallies: dict[str, dict[str, np.ndarray]] | None, words: WordsForReport,
                      seeds: Iterable[str]) -> dict[str, Any]:
    """A manifest's `diagnostics`: the built map's `WordsForReport.diagnostics`, plus under `comparison`
    each compared map's lifts, entropy ratio and budget error."""
    if tallies is None:
        return {}
    seeds = list(seeds)
    (name, built), *others = tallies.items()
    report = {"map": name, **words.diagnostics(built, seeds), "comparison": {}}

    for other, counts in others:  # figures only: no word's text is read for a compared map
        figures = signal_figures(counts, words, seeds, ENGLISH_STOP_WORDS)
        report["comparison"][other] = {key: figures[key] for key in ("groups", "entropy_ratio", "max_budget_error",
                                                                        "budget_shortfall")}
    return report


class WordsForReport:
    """What `signal_report` needs of the word types, without holding their text: each type's
    similarity (by word_index), the word_index of given words, and the text of a few types.

    `of_table` serves a whole word table in memory (inspect); the build passes its compact arrays
    (`maskstream.pipelines.build.core.word_lookup`) and reads the few words it names from the word-table files."""

    def __init__(self, similarity: np.ndarray, index_of: Callable[[Sequence[str]], np.ndarray],
                 text_of: Callable[[np.ndarray], list[str]]):
        self.similarity, self.index_of, self.text_of = similarity, index_of, text_of

    @classmethod
    def of_table(cls, word_table: Any) -> WordsForReport:
        """From a word table (pyarrow, WORD_TABLE_SCHEMA) in memory."""
        index = word_table.column("word_index").to_numpy()
        words = np.empty(word_table.num_rows, object)
        words[index] = word_table.column("word").to_pylist()
        similarity = np.zeros(word_table.num_rows, np.float32)
        similarity[index] = word_table.column("similarity").to_numpy()
        row = {word: i for i, word in enumerate(words)}
        return cls(similarity, lambda names: np.array([row.get(w, -1) for w in names], np.int64),
                   lambda indices: [words[i] for i in indices])

    def diagnostics(self, counts: dict[str, np.ndarray] | None, seeds: Iterable[str]) -> dict[str, Any]:
        """`signal_report` of a tally with scikit-learn's English stop words; {} without a tally (no rows)."""

        if counts is None:
            return {}
        return signal_report(counts, self, seeds, ENGLISH_STOP_WORDS)


def merge_tallies(tallies: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The sum of tallies: per word type the tokens and masks in the order given (so the sums are the
    same bit for bit as adding dense arrays tally by tally), the rest added or maxed."""
    tallies = list(tallies)
    words, inverse = np.unique(np.concatenate([t["words"] for t in tallies]), return_inverse=True)
    merged = {
        "words": words,
        "tokens": np.bincount(inverse, weights=np.concatenate([t["tokens"] for t in tallies]),
                              minlength=len(words)).astype(np.int64),
        "masks": np.bincount(inverse, weights=np.concatenate([t["masks"] for t in tallies]), minlength=len(words)),
    }
    for key in tallies[0].keys() - merged.keys():
        values = [t[key] for t in tallies]
        merged[key] = np.maximum.reduce(values) if key == "max_budget_error" else sum(values[1:], values[0].copy())
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


def signal_report(counts: dict[str, np.ndarray], words: WordsForReport, seeds: Iterable[str],
                  stop_words: Iterable[str]) -> dict[str, Any]:
    """The figures of the module docstring, JSON-ready, of a (merged) tally."""
    report = {
        **signal_figures(counts, words, seeds, stop_words),
        **named_words(counts, words),
        "histogram": {"edges": HISTOGRAM_EDGES.tolist(), "counts": counts["histogram"].tolist()},
        "near_uniform_thresholds": dict(NEAR_UNIFORM),
    }
    report["warning"] = near_uniform_warning(report)
    return report


def signal_figures(counts: dict[str, np.ndarray], words: WordsForReport, seeds: Iterable[str],
                   stop_words: Iterable[str]) -> dict[str, Any]:
    """The report's figures that need no word's text: totals, group shares, entropy ratio, budget."""
    present_words, tokens, masks = counts["words"], counts["tokens"], counts["masks"]
    similarity = words.similarity[present_words]  # of the types present, in word_index order
    total_tokens = int(tokens.sum() + counts["other"][0])
    total_masks = float(masks.sum() + counts["other"][1])

    def members(names):
        index = np.asarray(words.index_of(sorted(set(names))), np.int64)
        return np.isin(present_words, index[index >= 0])

    is_seed, is_stop = members(seeds), members(stop_words)
    present = np.flatnonzero((tokens > 0) & ~is_seed)
    # The top 1 % of the dataset's other word types by similarity (at least one).
    similar = present[np.argsort(-similarity[present], kind="stable")[: max(1, round(SIMILAR_FRACTION * len(present)))]]
    is_similar = np.zeros(len(tokens), bool)
    is_similar[similar] = True
    groups = {
        "seed_words": _share(tokens[is_seed].sum(), masks[is_seed].sum(), total_tokens, total_masks),
        "similar_words": _share(tokens[is_similar].sum(), masks[is_similar].sum(), total_tokens, total_masks),
        "stop_words": _share(tokens[is_stop].sum(), masks[is_stop].sum(), total_tokens, total_masks),
        "outside_words": _share(int(counts["other"][0]), counts["other"][1], total_tokens, total_masks),
    }
    return {
        "tokens": total_tokens,
        "expected_masks": total_masks,
        "groups": groups,
        "similar_words_count": int(len(similar)),
        "entropy_ratio": entropy_ratio(total_masks, float(counts["sum_p_log_p"][0]), total_tokens),
        "max_budget_error": float(counts["max_budget_error"][0]),
        "budget_shortfall": shortfall_report(counts),
    }


def named_words(counts: dict[str, np.ndarray], words: WordsForReport) -> dict[str, list[dict[str, Any]]]:
    """The most masked word types and the frequent ones masked least, with their text (one `text_of`)."""
    present_words, tokens, masks = counts["words"], counts["tokens"], counts["masks"]
    similarity = words.similarity[present_words]
    by_masks = np.lexsort((present_words, -masks))[:TOP_WORDS]
    frequent = np.lexsort((present_words, -tokens))[:FREQUENT_WORDS]
    frequent = frequent[tokens[frequent] > 0]
    rate = masks / np.maximum(tokens, 1)
    fewest = frequent[np.lexsort((frequent, rate[frequent]))][:TOP_WORDS]
    text = dict(zip(np.concatenate([by_masks, fewest]).tolist(),
                    words.text_of(present_words[np.concatenate([by_masks, fewest])]), strict=True))

    def word_rows(positions):
        return [{"word": text[int(i)], "tokens": int(tokens[i]), "expected_masks": float(masks[i]),
                 "mean_probability": float(rate[i]), "similarity": float(similarity[i])} for i in positions]

    return {"most_masked": word_rows(by_masks), "frequent_least_masked": word_rows(fewest)}


def shortfall_report(counts: dict[str, np.ndarray]) -> dict[str, Any]:
    """The manifest's `diagnostics.budget_shortfall` from a tally's `budget_shortfall` sums."""
    sequences, short, short_budget, missing = (float(counts[key][0]) for key in SHORTFALL_KEYS)
    return {"tolerance": SHORTFALL_TOLERANCE, "sequences": int(sequences), "short_sequences": int(short),
            "short_share": short / sequences if sequences else 0.0, "missing_masks": missing,
            "missing_share_of_their_budget": missing / short_budget if short_budget else 0.0}


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
    import matplotlib

    matplotlib.use("Agg")
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


def signal_reports(tallies: list[dict], word_table: Any, seeds: list[str]) -> dict[str, dict]:
    """`signal_report` per map of the shards' `maskstream.pipelines.build.inspect.signal.map_tallies` (one per shard):
    the stored probabilities first, then each map of `comparison_maps`, recomputed."""
    words = WordsForReport.of_table(word_table)  # once: it holds every word type's text and index
    return {name: words.diagnostics(tally, seeds) for name, tally in merge_map_tallies(tallies).items()}

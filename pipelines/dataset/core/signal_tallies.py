"""Signal tallies and the figures the build records of them (the manifest's diagnostics): does a
dataset's masking budget go to the words that make the domain different, or is it spread almost
uniformly? The lines `inspect` and `build` print of them, and the plots, are
`maskstream.pipelines.dataset.inspect.signal`.

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

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from maskstream.mask_signal.probability import (
    PAPER_SHARPNESS,
    SHARPENED,
    MaskSettings,
    mask_probabilities_flat,
)
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

    # A config without max_length (not a build's) pads to each batch's longest row, as before.
    base = MaskSettings(budget=config.get("budget", 0.15), max_length=config.get("max_length", 0))
    paper = dataclasses.replace(base, weighting="similarity", alpha=1.0, sharpness=PAPER_SHARPNESS)
    sharpened = dataclasses.replace(base, **SHARPENED)
    return {
        f"paper (similarity, alpha 1, sharpness {PAPER_SHARPNESS:g})": paper.options(),
        "reference (rank N - r, alpha 1)": dataclasses.replace(base, weighting="rank", alpha=1.0).options(),
        f"sharpened (sharpness {sharpened.sharpness:g}, floor {sharpened.floor:g})": sharpened.options(),
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
    (`maskstream.mask_signal.word_lookup`) and reads the few words it names from the word-table files."""

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

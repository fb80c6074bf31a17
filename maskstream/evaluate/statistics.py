"""The evaluation's statistics: paired by seed, and resampled over seeds and texts together.

For an arm A and the baseline B run with the same seeds, d_s = metric(A, s) - metric(B, s):

- mean, sd (ddof 1) and a two-sided t-interval over seeds (`scipy.stats.t`);
- the Wilcoxon signed-rank p-value (`scipy.stats.wilcoxon`, two-sided; exact for small n:
  with 5 seeds it cannot be below 0.0625, with 6 not below 0.03125);
- the power of the two-sided paired t-test (noncentral t, `scipy.stats.nct`) and the minimum
  detectable effect: the true mean difference the design finds with 80% power at alpha 0.05,
  given n seeds and the observed sd of the differences;
- Holm's step-down adjustment of the secondary comparisons' p-values (one family);
- a bootstrap over test texts: the seeds' mean macro-F1 difference recomputed on resamples of the
  test set (the same resample for every seed and both arms), so the report can say how much a
  result owes to this one test set and not only to the seeds;
- TOST (two one-sided paired t-tests) for equivalence within a margin;
- the number of seeds a paired t-test needs for a given power;
- the hierarchical bootstrap of the cross-fitted design: seeds and near-duplicate clusters resampled
  together (seeds and texts are crossed: every seed is scored on every text, so one cluster draw
  serves every seed of a resample), and the share of its variance that comes from each.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ALPHA = 0.05
POWER = 0.8


def paired_t_power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided one-sample t-test on n paired differences with standard deviation `sd`
    when their true mean is `effect`."""
    # heavy: scikit-learn and SciPy load only where they are used
    from scipy import stats

    if n < 2 or sd <= 0:
        return math.nan
    df = n - 1
    critical = stats.t.ppf(1 - alpha / 2, df)
    noncentrality = effect / (sd / math.sqrt(n))
    upper = stats.nct.sf(critical, df, noncentrality)
    # the far tail: scipy returns nan where it underflows (large noncentrality, df 1)
    lower = float(np.nan_to_num(stats.nct.cdf(-critical, df, noncentrality), nan=0.0))
    return float(upper + lower)


def minimum_detectable_effect(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true mean difference detected with `power` by the two-sided paired t-test."""
    # heavy: scikit-learn and SciPy load only where they are used
    from scipy.optimize import brentq

    if n < 2 or not sd > 0:
        return math.nan
    high = sd
    while paired_t_power(high, sd, n, alpha) < power:
        high *= 2
    return float(brentq(lambda d: paired_t_power(d, sd, n, alpha) - power, 0.0, high, xtol=1e-10))


def paired_summary(arm: dict[int, float], base: dict[int, float], alpha: float = ALPHA) -> dict[str, Any]:
    """The statistics of the module docstring over the seeds both runs have."""
    # heavy: scikit-learn and SciPy load only where they are used
    from scipy import stats

    seeds = sorted(set(arm) & set(base))
    diffs = np.array([arm[s] - base[s] for s in seeds], dtype=np.float64)
    n = len(diffs)
    out: dict[str, Any] = {"seeds": seeds, "n": n, "differences": diffs.tolist(), "mean": math.nan, "sd": math.nan,
                           "ci": [math.nan, math.nan], "p_t": math.nan, "p_wilcoxon": math.nan, "mde": math.nan}
    if n == 0:
        return out
    out["mean"] = float(diffs.mean())
    if n < 2:
        return out
    sd = float(diffs.std(ddof=1))
    out["sd"] = sd
    if sd > 0:
        half = stats.t.ppf(1 - alpha / 2, n - 1) * sd / math.sqrt(n)
        out["ci"] = [out["mean"] - half, out["mean"] + half]
        out["p_t"] = float(stats.ttest_1samp(diffs, 0.0).pvalue)
        out["mde"] = minimum_detectable_effect(sd, n, alpha)
    else:
        out["ci"] = [out["mean"], out["mean"]]
    if np.any(diffs != 0):
        out["p_wilcoxon"] = float(stats.wilcoxon(diffs).pvalue)
    return out


def mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values of one family of tests (nan stays nan and is not counted)."""
    named = sorted(((p, name) for name, p in pvalues.items() if not math.isnan(p)))
    adjusted, running = {name: math.nan for name in pvalues}, 0.0
    for rank, (p, name) in enumerate(named):
        running = max(running, min(1.0, (len(named) - rank) * p))  # monotone: never below an earlier step
        adjusted[name] = running
    return adjusted


def macro_f1_weighted(truth: np.ndarray, predicted: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Macro-F1 of integer-coded labels under each row of `weights` (resamples x texts: how many times
    each text is drawn). As scikit-learn's f1_score(average="macro"): the mean over the labels present
    in the resample's truth or predictions."""
    classes = int(max(truth.max(), predicted.max())) + 1
    true_hot = np.eye(classes)[truth]  # texts x classes
    pred_hot = np.eye(classes)[predicted]
    hits = weights @ (true_hot * pred_hot)  # resamples x classes
    support = weights @ true_hot + weights @ pred_hot
    present = support > 0
    f1 = np.divide(2 * hits, support, out=np.zeros_like(hits), where=present)
    return (f1 * present).sum(1) / present.sum(1)


def bootstrap_difference(truth: list[str], arm: dict[int, list[str]], base: dict[int, list[str]],
                         resamples: int, seed: int = 0, alpha: float = ALPHA) -> dict[str, Any]:
    """Mean over paired seeds of macro-F1(arm) - macro-F1(base), and its percentile interval over
    `resamples` bootstrap resamples of the test texts (seeds held fixed)."""
    seeds = sorted(set(arm) & set(base))
    out: dict[str, Any] = {"n": len(seeds), "resamples": resamples, "mean": math.nan, "ci": [math.nan, math.nan]}
    if not seeds:
        return out
    codes = {label: i for i, label in enumerate(sorted(set(truth).union(*arm.values(), *base.values())))}
    y = np.array([codes[t] for t in truth])
    weights = np.random.default_rng(seed).multinomial(len(truth), np.full(len(truth), 1 / len(truth)), resamples)
    full = np.ones((1, len(truth)))
    diffs, observed = np.zeros(resamples), 0.0
    for s in seeds:
        a, b = (np.array([codes[p] for p in preds[s]]) for preds in (arm, base))
        diffs += macro_f1_weighted(y, a, weights) - macro_f1_weighted(y, b, weights)
        observed += float(macro_f1_weighted(y, a, full)[0] - macro_f1_weighted(y, b, full)[0])
    diffs /= len(seeds)
    out["mean"] = observed / len(seeds)
    out["ci"] = [float(np.quantile(diffs, alpha / 2)), float(np.quantile(diffs, 1 - alpha / 2))]
    return out


def tost(diffs: list[float] | np.ndarray, margin: float, alpha: float = ALPHA) -> dict[str, float]:
    """Two one-sided paired t-tests of H0: mean <= -margin and H0: mean >= +margin; p is the larger of
    the two. Equivalence at `alpha` when p < alpha, i.e. the (1 - 2 alpha) t-interval lies inside
    (-margin, +margin)."""
    # heavy: scikit-learn and SciPy load only where they are used
    from scipy import stats

    d = np.asarray(diffs, dtype=np.float64)
    n = len(d)
    if n < 2 or not d.std(ddof=1) > 0:
        return {"p": math.nan, "p_lower": math.nan, "p_upper": math.nan, "ci90": [math.nan, math.nan]}
    se = d.std(ddof=1) / math.sqrt(n)
    p_lower = float(stats.t.sf((d.mean() + margin) / se, n - 1))
    p_upper = float(stats.t.cdf((d.mean() - margin) / se, n - 1))
    half = stats.t.ppf(1 - alpha, n - 1) * se
    return {"p": max(p_lower, p_upper), "p_lower": p_lower, "p_upper": p_upper,
            "ci90": [float(d.mean() - half), float(d.mean() + half)]}


def seeds_for_power(effect: float, sd: float, power: float = POWER, alpha: float = ALPHA, low: int = 2,
                    cap: int = 10_000) -> int:
    """The fewest seeds (>= low, <= cap) at which the two-sided paired t-test finds `effect` with `power`
    (with no spread at all, two seeds)."""
    if not sd > 0:
        return max(low, 2)
    for n in range(max(low, 2), cap + 1):
        if paired_t_power(effect, sd, n, alpha) >= power:
            return n
    return cap


SHARE_BATCHES = 10  # batches of the resamples whose spread gives the variance shares' Monte Carlo error


def crossed_bootstrap(truth: list[np.ndarray], clusters: list[np.ndarray], arm: dict[int, list[np.ndarray]],
                      base: dict[int, list[np.ndarray]], resamples: int, seed: int = 0, alpha: float = ALPHA
                      ) -> dict[str, Any]:
    """Mean over paired seeds of score(arm) - score(base), a seed's score being the mean over folds of
    macro-F1 on the fold's texts, and its percentile interval under three resampling schemes:
    `hierarchical` (seeds with replacement and, in each fold, near-duplicate clusters with replacement),
    `seeds` only (texts fixed) and `texts` only (seeds fixed); the hierarchical scheme's share of
    resamples above 0 (`p_positive`); the variance components (`variance_components`) and their shares
    of the hierarchical variance (`share`), with their Monte Carlo error (`share_mc_error`).

    truth[f], clusters[f]: the integer labels and cluster ids of fold f's texts; arm[s][f], base[s][f]:
    the integer predictions of seed s on fold f."""
    rng = np.random.default_rng(seed)
    seeds = sorted(set(arm) & set(base))
    out: dict[str, Any] = {"n": len(seeds), "resamples": resamples, "mean": math.nan}
    if not seeds:
        return out
    folds = len(truth)
    # text weights of each fold under a cluster resample: a text counts as often as its cluster is drawn
    text_weights = []
    for f in range(folds):
        _, cluster_index = np.unique(clusters[f], return_inverse=True)
        draws = rng.multinomial(cluster_index.max() + 1, np.full(cluster_index.max() + 1, 1 / (cluster_index.max() + 1)),
                                resamples)
        text_weights.append(draws[:, cluster_index].astype(np.float64))
    ones = [np.ones((1, len(t))) for t in truth]
    # per seed: the difference on each resample of the texts, and on the texts as they are
    resampled = np.zeros((len(seeds), resamples))
    observed = np.zeros(len(seeds))
    for i, s in enumerate(seeds):
        for f in range(folds):
            gap = macro_f1_weighted(truth[f], arm[s][f], text_weights[f]) - macro_f1_weighted(
                truth[f], base[s][f], text_weights[f])
            resampled[i] += gap / folds
            observed[i] += float(macro_f1_weighted(truth[f], arm[s][f], ones[f])[0]
                                 - macro_f1_weighted(truth[f], base[s][f], ones[f])[0]) / folds
    seed_draws = rng.multinomial(len(seeds), np.full(len(seeds), 1 / len(seeds)), resamples) / len(seeds)
    schemes = {"hierarchical": (seed_draws * resampled.T).sum(1), "seeds": seed_draws @ observed,
               "texts": resampled.mean(0)}
    out["mean"] = float(observed.mean())
    out["differences"] = observed.tolist()
    for name, values in schemes.items():
        out[name] = {"ci": [float(np.quantile(values, alpha / 2)), float(np.quantile(values, 1 - alpha / 2))],
                     "ci90": [float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha))],
                     "sd": float(values.std(ddof=1))}
    out["hierarchical"]["p_positive"] = float((schemes["hierarchical"] > 0).mean())
    out["texts_judged"] = int(sum(len(t) for t in truth))
    out["components"] = variance_components(out)
    out["share"] = variance_shares(out["components"])
    out["share_mc_error"] = share_mc_error(schemes)
    return out


def variance_shares(components: dict[str, float]) -> dict[str, float]:
    total = sum(components.values())
    return {name: (v / total if total > 0 else math.nan) for name, v in components.items()}


def share_mc_error(schemes: dict[str, np.ndarray], batches: int = SHARE_BATCHES) -> dict[str, float]:
    """The Monte Carlo standard error of the variance shares, by batch means: the shares computed on each of
    `batches` equal batches of the resamples, their sd over sqrt(batches). It says which digits of a share
    another random stream of the same bootstrap would keep (issue 74: one stream printed 0.19 where 16
    gave 0.15 ± 0.02)."""
    split = {name: np.array_split(values, batches) for name, values in schemes.items()}
    per_batch = [variance_shares(variance_components({name: {"sd": float(parts[b].std(ddof=1))}
                                                      for name, parts in split.items()}))
                 for b in range(batches)]
    return {name: float(np.std([b[name] for b in per_batch], ddof=1) / math.sqrt(batches))
            for name in per_batch[0]}


def variance_components(boot: dict[str, Any]) -> dict[str, float]:
    """The hierarchical interval's variance split into seeds (the seeds-only scheme's), texts (the
    texts-only scheme's) and their interaction, what the hierarchical scheme has beyond both (each seed's
    own text noise: it shrinks with seeds and with texts), clipped at 0."""
    seeds, texts = boot["seeds"]["sd"] ** 2, boot["texts"]["sd"] ** 2
    return {"seeds": seeds, "texts": texts,
            "seed_x_text": max(boot["hierarchical"]["sd"] ** 2 - seeds - texts, 0.0)}


def projected_variance(components: dict[str, float], seeds: int, texts: int, new_seeds: float, new_texts: float
                       ) -> float:
    """The hierarchical variance of the mean difference with `new_seeds` and `new_texts`, from the components
    measured with `seeds` and `texts`: the seeds' part shrinks as 1/seeds, the texts' as 1/texts, the
    interaction as 1/(seeds x texts)."""
    return (components["seeds"] * seeds / new_seeds + components["texts"] * texts / new_texts
            + components["seed_x_text"] * seeds * texts / (new_seeds * new_texts))


def hierarchical_power(effect: float, variance: float, alpha: float = ALPHA) -> float:
    """Power of a two-sided test at `alpha` (normal, with the hierarchical standard error) to find a true
    difference `effect`."""
    # heavy: scikit-learn and SciPy load only where they are used
    from scipy import stats

    if not variance > 0:
        return math.nan
    z, shift = stats.norm.ppf(1 - alpha / 2), effect / math.sqrt(variance)
    return float(stats.norm.cdf(shift - z) + stats.norm.cdf(-shift - z))


def design_for_power(components: dict[str, float], seeds: int, texts: int, effect: float, power: float = POWER,
                     alpha: float = ALPHA) -> dict[str, int | None]:
    """The seeds (with these texts) and the labeled texts (with these seeds) at which the hierarchical
    standard error gives `power` for `effect`; None where no number reaches it (the other part alone is
    too large)."""
    # heavy: scikit-learn and SciPy load only where they are used
    from scipy import stats

    target = (effect / (stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))) ** 2  # the variance allowed
    seed_part = components["seeds"] + components["seed_x_text"]  # what more seeds shrink, texts fixed
    text_part = components["texts"] + components["seed_x_text"]  # what more texts shrink, seeds fixed
    need_seeds = seeds * seed_part / (target - components["texts"]) if target > components["texts"] else None
    need_texts = texts * text_part / (target - components["seeds"]) if target > components["seeds"] else None
    return {"seeds": None if need_seeds is None else max(2, math.ceil(need_seeds)),
            "texts": None if need_texts is None else math.ceil(need_texts)}

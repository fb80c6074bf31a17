"""Seed-level paired statistics: the unit of replication is the seed, not the test example.

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
  result owes to this one test set and not only to the seeds.
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
    from scipy.optimize import brentq

    if n < 2 or not sd > 0:
        return math.nan
    high = sd
    while paired_t_power(high, sd, n, alpha) < power:
        high *= 2
    return float(brentq(lambda d: paired_t_power(d, sd, n, alpha) - power, 0.0, high, xtol=1e-10))


def paired_summary(arm: dict[int, float], base: dict[int, float], alpha: float = ALPHA) -> dict[str, Any]:
    """The statistics of the module docstring over the seeds both runs have."""
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

"""`maskstream evaluate` (issue 50): the exact near-duplicate join against every pair, folds that keep
clusters whole, out-of-fold probes, the statistics against scipy and scikit-learn, and the whole command
on a labeled file of one's own, as a new user runs it."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from maskstream.evaluate import neardup, statistics
from maskstream.evaluate.design import ARMS, EvaluateConfig, assign_folds
from maskstream.evaluate.experiment import claim, pilot_choice
from maskstream.evaluate.probe import out_of_fold, probe_splits

REPO = Path(__file__).resolve().parents[1]
EFFECT = REPO / "benchmarks" / "effect"


def shipped_texts(n: int) -> list[str]:
    lines = (REPO / "data" / "debian-science.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines[:n]]


def test_the_join_finds_exactly_the_pairs_an_all_pairs_check_finds() -> None:
    texts = shipped_texts(500)
    # near-duplicates at the threshold's edge: a text with words appended until it is just above / below 0.5
    base = texts[0]
    texts += [base + " and more words here", base.split(".")[0], "short one", "Short  ONE"]
    shingled = [neardup.views(t) for t in texts]
    brute = {(i, j) for i, j in itertools.combinations(range(len(texts)), 2)
             if any(neardup.jaccard(a, b) >= neardup.THRESHOLD for a, b in zip(shingled[i], shingled[j], strict=True))}
    index = neardup.NearDuplicateIndex(texts)
    joined = {(i, j) for i, text in enumerate(texts) for j in index.matches(text) if i < j}
    assert len(brute) > 100 and joined == brute
    ids = neardup.clusters(texts)
    assert all(ids[i] == ids[j] for i, j in brute)
    held = texts[:50]
    assert neardup.with_near_duplicate(texts, held) == sorted(
        i for i in range(len(texts)) if any(neardup.near_duplicates(texts[i], h) for h in held))


def test_folds_keep_clusters_whole_are_stratified_and_ignore_file_order() -> None:
    rng = random.Random(0)
    cluster_of = [i // 3 if i < 60 else i for i in range(300)]  # 20 clusters of three, the rest alone
    label_of_cluster = {c: rng.choice("aab") for c in set(cluster_of)}
    labels = [label_of_cluster[c] for c in cluster_of]
    keys = {c: f"key{c}" for c in set(cluster_of)}
    folds = assign_folds(labels, cluster_of, keys, 2)
    for c in set(cluster_of):
        assert len({folds[i] for i in range(300) if cluster_of[i] == c}) == 1
    for label in "ab":
        sizes = [sum(1 for y, f in zip(labels, folds, strict=True) if y == label and f == k) for k in (0, 1)]
        assert abs(sizes[0] - sizes[1]) <= 3
    order = list(range(300))
    rng.shuffle(order)
    shuffled = assign_folds([labels[i] for i in order], [cluster_of[i] for i in order], keys, 2)
    assert [shuffled[order.index(i)] for i in range(300)] == folds


def test_every_text_is_predicted_once_by_a_probe_that_never_saw_its_cluster() -> None:
    rng = np.random.default_rng(0)
    labels = [str(i % 3) for i in range(120)]
    groups = [i // 4 for i in range(120)]
    x = rng.normal(size=(120, 8)) + np.eye(3)[[i % 3 for i in range(120)]] @ rng.normal(size=(3, 8))
    splits = probe_splits(labels, groups, 5)
    assert sorted(np.concatenate([held for _, held in splits]).tolist()) == list(range(120))
    for train, held in splits:
        assert not {groups[i] for i in train} & {groups[i] for i in held}
    predicted, probabilities = out_of_fold(x, labels, splits, 1.0)
    assert len(predicted) == 120 and (predicted == np.array(labels, dtype=object)).mean() > 0.5
    # The class probabilities stored beside them: rows of a distribution whose argmax is the prediction.
    values = np.array(probabilities["values"])
    assert probabilities["labels"] == ["0", "1", "2"] and values.shape == (120, 3)
    assert np.allclose(values.sum(1), 1.0, atol=1e-5)
    assert (np.array(probabilities["labels"], dtype=object)[values.argmax(1)] == predicted).all()


def test_paired_statistics_tost_and_power_match_scipy() -> None:
    from scipy import stats

    arm = {0: 0.71, 1: 0.74, 2: 0.69, 3: 0.73, 4: 0.75, 5: 0.70}
    base = {0: 0.70, 1: 0.71, 2: 0.70, 3: 0.70, 4: 0.72, 5: 0.71, 9: 0.5}  # seed 9 has no pair
    summary = statistics.paired_summary(arm, base)
    diffs = np.array([arm[s] - base[s] for s in range(6)])
    low, high = stats.t.interval(0.95, 5, loc=diffs.mean(), scale=stats.sem(diffs))
    assert summary["ci"] == pytest.approx([low, high], abs=1e-12)
    assert summary["p_wilcoxon"] == pytest.approx(stats.wilcoxon(diffs).pvalue)
    result = statistics.tost(diffs, 0.03)
    assert result["p_lower"] == pytest.approx(stats.ttest_1samp(diffs, -0.03, alternative="greater").pvalue)
    assert result["p_upper"] == pytest.approx(stats.ttest_1samp(diffs, 0.03, alternative="less").pvalue)
    assert result["p"] == max(result["p_lower"], result["p_upper"])
    # the seeds the power rule asks for: enough at n, not at n - 1; and simulated tests agree
    n = statistics.seeds_for_power(0.01, 0.0145)
    assert statistics.paired_t_power(0.01, 0.0145, n) >= 0.8 > statistics.paired_t_power(0.01, 0.0145, n - 1)
    draws = np.random.default_rng(0).normal(0.01, 0.0145, size=(20_000, n))
    assert (stats.ttest_1samp(draws, 0.0, axis=1).pvalue < 0.05).mean() == pytest.approx(0.8, abs=0.02)
    assert statistics.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": math.nan}) == pytest.approx(
        {"a": 0.03, "b": 0.06, "c": 0.06, "d": math.nan}, nan_ok=True)


def test_the_crossed_bootstrap_matches_scikit_learn_and_splits_its_variance() -> None:
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(1)
    truth = [rng.integers(0, 3, 80), rng.integers(0, 3, 70)]
    clusters = [np.arange(80) // 2, np.arange(70)]
    noisy = {s: [np.where(rng.random(len(t)) < 0.7, t, rng.integers(0, 3, len(t))) for t in truth] for s in range(6)}
    worse = {s: [np.where(rng.random(len(t)) < 0.6, t, rng.integers(0, 3, len(t))) for t in truth] for s in range(6)}
    out = statistics.crossed_bootstrap(truth, clusters, noisy, worse, resamples=400)
    observed = np.mean([np.mean([f1_score(truth[f], noisy[s][f], average="macro")
                                 - f1_score(truth[f], worse[s][f], average="macro") for f in (0, 1)]) for s in range(6)])
    assert out["mean"] == pytest.approx(observed, abs=1e-12) and out["n"] == 6
    h, s, t = (out[k]["ci"] for k in ("hierarchical", "seeds", "texts"))
    assert h[0] < observed < h[1] and h[1] - h[0] >= max(s[1] - s[0], t[1] - t[0]) * 0.9
    assert sum(out["share"].values()) == pytest.approx(1.0)  # texts, seeds and their interaction
    components = out["components"]
    assert components["texts"] == pytest.approx(out["texts"]["sd"] ** 2)
    assert sum(components.values()) == pytest.approx(max(out["hierarchical"]["sd"] ** 2,
                                                          components["seeds"] + components["texts"]))
    draws = statistics.crossed_bootstrap(truth, clusters, noisy, worse, resamples=400)  # the same seed: the same draws
    assert draws["hierarchical"]["p_positive"] == out["hierarchical"]["p_positive"] > 0.5  # `noisy` is better
    # the same predictions for every seed: nothing varies over seeds
    same = statistics.crossed_bootstrap(truth, clusters, {s: noisy[0] for s in range(4)},
                                        {s: worse[0] for s in range(4)}, resamples=200)
    assert same["seeds"]["sd"] == pytest.approx(0.0, abs=1e-12) and same["share"]["texts"] == pytest.approx(1.0)


def test_the_shares_monte_carlo_error_is_the_spread_of_independent_streams() -> None:
    """The batch-means error one bootstrap stream reports is what 24 streams of the same bootstrap (other
    random seeds) actually spread by, within a factor of two, share by share."""
    rng = np.random.default_rng(3)
    truth = [rng.integers(0, 3, 300), rng.integers(0, 3, 280)]
    clusters = [np.arange(300) // 3, np.arange(280) // 2]
    arm = {s: [np.where(rng.random(len(t)) < 0.72, t, rng.integers(0, 3, len(t))) for t in truth] for s in range(5)}
    base = {s: [np.where(rng.random(len(t)) < 0.7, t, rng.integers(0, 3, len(t))) for t in truth] for s in range(5)}
    streams = [statistics.crossed_bootstrap(truth, clusters, arm, base, resamples=1000, seed=seed) for seed in range(24)]
    for name in ("texts", "seeds", "seed_x_text"):
        spread = np.std([out["share"][name] for out in streams], ddof=1)
        reported = np.mean([out["share_mc_error"][name] for out in streams])
        assert 0.5 < reported / spread < 2.0, (name, reported, spread)


@pytest.mark.parametrize(("share", "error", "said"), [
    (0.7213, 0.0198, "0.72 ± 0.02"), (0.0968, 0.0042, "0.097 ± 0.004"), (0.0198, 0.0009, "0.020 ± 0.001"),
    (0.0, 7e-33, "0.000 ± 0.000"), (1.0, 0.0, "1.00"), (math.nan, 0.01, "–"), (0.5, 0.12, "0.5 ± 0.1")])
def test_a_share_is_given_to_the_digits_its_monte_carlo_error_supports(share, error, said) -> None:
    from maskstream.evaluate.report import with_error

    assert with_error(share, error) == said


@pytest.mark.parametrize("components", [{"seeds": 0.215e-4, "texts": 1.14e-4, "seed_x_text": 0.41e-4},
                                        {"seeds": 0.03e-4, "texts": 0.2e-4, "seed_x_text": 0.05e-4}])
def test_the_design_for_power_counts_texts_and_seeds(components) -> None:
    """Issue 50's components (points²/10⁴): no number of seeds reaches 80 % power at ±1 with its 2,288 texts,
    and the texts it would need are checked against the projected power itself, one short of it too."""
    seeds, texts, margin = 8, 2288, 0.01
    assert statistics.projected_variance(components, seeds, texts, seeds, texts) == pytest.approx(
        sum(components.values()))
    need = statistics.design_for_power(components, seeds, texts, margin)

    def power(new_seeds, new_texts):
        return statistics.hierarchical_power(margin, statistics.projected_variance(components, seeds, texts,
                                                                                   new_seeds, new_texts))
    for key, at in (("seeds", lambda n: power(n, texts)), ("texts", lambda n: power(seeds, n))):
        if need[key] is None:  # the other part alone is above the variance 80 % power allows
            assert at(10**9) < 0.8
        else:
            assert at(need[key]) >= 0.8 - 1e-9 and (need[key] <= 2 or at(need[key] - 1) < 0.8)
    assert statistics.hierarchical_power(margin, sum(components.values())) < 0.8


def test_the_decision_sentence_follows_the_pre_registered_rule() -> None:
    from maskstream.evaluate.report import decision

    def comparison(mean: float, p: float, low: float, high: float, tost_p: float = 0.5, n: int = 12) -> dict:
        return {"mean": mean, "n": n, "p_t": p, "tost": {"p": tost_p}, "ci": [low * 3, high * 3],
                "bootstrap": {"n": n, "hierarchical": {"ci": [low, high], "ci90": [low / 2, high / 2]}}}

    passing = comparison(0.03, 0.001, 0.01, 0.05)
    assert decision(comparison(0.012, 0.01, 0.002, 0.02), passing, 0.01, 12).startswith(
        "Difference masking beats random masking by 1.20 points [+0.20, +2.00]")
    assert decision(comparison(-0.012, 0.01, -0.02, -0.002), passing, 0.01, 12).startswith(
        "Random masking beats difference masking by 1.20 points")
    # significant by t but the hierarchical interval crosses zero: no superiority
    assert decision(comparison(0.012, 0.01, -0.001, 0.02), passing, 0.01, 12).startswith("Undecided at 12 seeds")
    equivalent = comparison(0.001, 0.6, -0.008, 0.009, tost_p=0.01)
    assert decision(equivalent, passing, 0.01, 12).startswith("Difference masking is within ±1 point of random")
    assert decision(comparison(0.012, 0.01, 0.002, 0.02, n=5), passing, 0.01, 12).startswith(
        "Undecided at 5 of 12 seeds (interim)")
    # No decision sentence with a failed or missing control, or below 5 seeds: an exploratory line.
    failing = comparison(0.001, 0.6, -0.01, 0.012)
    for control in (failing, None):
        for primary in (equivalent, comparison(0.012, 0.01, 0.002, 0.02)):
            assert decision(primary, control, 0.01, 12).startswith("Exploratory, no decision: the control")
    two_seeds = decision(comparison(0.047, 0.2, 0.013, 0.083, n=2), passing, 0.01, 2)
    assert two_seeds.startswith("Exploratory, no decision: 2 seeds, and a decision needs 5 or more")
    assert "t-interval over seeds is [+3.90, +24.90]" in two_seeds and "beats" not in two_seeds


def test_the_control_line_is_said_whatever_the_arms_and_seeds() -> None:
    from maskstream.evaluate.report import control_line, one_sided

    def control(mean: float, low: float, high: float, n: int = 2) -> dict:
        return {"mean": mean, "n": n, "bootstrap": {"n": n, "hierarchical": {"ci": [low, high], "p_positive": 0.4}}}

    # a run like the one docs/evidence.md shows: TAPT with random masking below no TAPT
    assert control_line(control(-0.0754, -0.1238, -0.0331), {"none", "random"}).startswith(
        "**The control does not pass:** random − none -7.54 [-12.38, -3.31] (2 seeds)")
    assert control_line(control(0.01, -0.002, 0.02, n=1), {"none", "random"}).startswith("**The control does not pass")
    assert control_line(control(0.0625, 0.0429, 0.0832), {"none", "random"}).startswith("**The control passes:**")
    assert "`none` missing" in control_line(None, {"random", "pmi_span"})
    # issue 74's shipped default run: clear of the seeds' spread, and the texts' draw spans zero
    texts_wide = control(0.0161, -0.0027, 0.0365, n=5)
    texts_wide["bootstrap"] |= {"seeds": {"ci": [0.0128, 0.0194]}, "share": {"texts": 0.89}}
    said = control_line(texts_wide, {"none", "random"})
    assert said.startswith("**The control does not pass:** random − none +1.61 [-0.27, +3.65] (5 seeds). On these")
    assert "(seeds-only interval [+1.28, +1.94])" in said and "share of its variance: 0.89" in said
    texts_wide["bootstrap"]["seeds"]["ci"] = [-0.001, 0.02]
    assert "more labeled texts" not in control_line(texts_wide, {"none", "random"})
    assert one_sided(control(-0.0159, -0.0381, 0.0036), 0.01) == (
        "ruled out by the hierarchical 95 % interval: a gain of 1 point or more; "
        "P(difference − random > 0) in the bootstrap: 0.40")


def test_the_report_of_the_shipped_default_run_with_and_without_probabilities(tmp_path: Path) -> None:
    """The committed default run (5 seeds, a failed control): nothing it says reads as a decision, and a
    results.jsonl written before the probe stored probabilities still gives the same report less the
    log-probability line."""
    from maskstream.evaluate.report import write_report

    committed = Path(__file__).parents[1] / "benchmarks/effect/results/defaults/shipped/results.jsonl"
    lines = [json.loads(line) for line in committed.read_text(encoding="utf-8").splitlines()]
    older = [{**r, "folds": [{k: v for k, v in f.items() if k != "probabilities"} for f in r["folds"]]}
             if r["kind"] == "arm" else r for r in lines]
    reports = {}
    for name, records in (("stored", lines), ("older", older)):
        (tmp_path / name).mkdir()
        results = tmp_path / name / "results.jsonl"
        results.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        write_report(results, tmp_path / name / "REPORT.md", planned=5, resamples=200)
        reports[name] = (tmp_path / name / "REPORT.md").read_text(encoding="utf-8")
    for report in reports.values():
        assert "**Decision:** Exploratory, no decision: the control (random − none) did not pass" in report
        assert "Difference − random (exploratory): " in report and "**The control does not pass:**" in report
        assert "beats" not in report
    assert "True label's log-probability under the probe" in reports["stored"]
    assert "log-probability" not in reports["older"]
    def kept(report: str) -> list[str]:
        return [line for line in report.splitlines() if line and "log-probability" not in line]
    assert kept(reports["older"]) == kept(reports["stored"])  # the same figures: the bootstrap is seeded


def test_pilot_rule_picks_the_largest_gain_ties_to_fewer_passes() -> None:
    def line(arm: str, seed: int | None, passes: float, score: float) -> dict:
        return {"arm": arm, "seed": seed, "passes": passes, "macro_f1": score}

    none = [line("none", None, 0, 0.70)]
    close = none + [line("random", 100, 4, 0.74), line("random", 101, 4, 0.72), line("random", 100, 8, 0.745),
                    line("random", 101, 8, 0.72)]
    assert pilot_choice(close, [4, 8], [100, 101])["passes"] == 4  # 8 is within 0.5 points of the best
    clear = none + [line("random", s, 4, 0.71) for s in (100, 101)] + [line("random", s, 8, 0.75) for s in (100, 101)]
    assert pilot_choice(clear, [4, 8], [100, 101])["passes"] == 8
    lost = none + [line("random", s, p, 0.69) for s in (100, 101) for p in (4, 8)]
    assert pilot_choice(lost, [4, 8], [100, 101])["no_gain"] is True


def test_a_claimed_run_is_left_to_its_process(tmp_path: Path) -> None:
    with claim(tmp_path / "x.lock") as first, claim(tmp_path / "x.lock") as second:
        assert first and not second
    with claim(tmp_path / "x.lock") as again:
        assert again


def test_settings_are_checked_on_creation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="random"):
        EvaluateConfig(labeled="l.jsonl", output=tmp_path, model="m", arms=("none", "difference"))
    with pytest.raises(ValueError, match="background"):
        EvaluateConfig(labeled="l.jsonl", output=tmp_path, model="m", arms=("random", "background_sharpened"))
    with pytest.raises(ValueError, match="folds"):
        EvaluateConfig(labeled="l.jsonl", output=tmp_path, model="m", folds=1)
    with pytest.raises(ValueError, match="steps"):
        EvaluateConfig(labeled="l.jsonl", output=tmp_path, model="m", steps=0)
    with pytest.raises(ValueError, match="--steps fixes"):
        EvaluateConfig(labeled="l.jsonl", output=tmp_path, model="m", steps=100, passes=(10.0, 20.0))


def test_no_absolute_path_in_the_committed_files() -> None:
    pattern = re.compile(r"(?<![\w.~])/(?:work|home|tmp|root|Users|opt|var|mnt)/")
    offenders = [p.relative_to(REPO).as_posix() for p in EFFECT.rglob("*")
                 if p.is_file() and p.suffix in (".py", ".md", ".jsonl", ".json") and pattern.search(p.read_text())]
    assert offenders == []


def test_corpora_read_every_format_and_count_what_they_reject(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from maskstream.evaluate.corpora import read_labeled, read_texts

    labeled = tmp_path / "l.jsonl"
    labeled.write_text('{"t": "good one", "y": "a"}\n{"t": "good two", "y": 2}\nnot json\n{"t": "", "y": "a"}\n'
                       '{"t": "no label"}\n')
    rows, rejects = read_labeled(str(labeled), "t", "y")
    assert rows == [{"text": "good one", "label": "a"}, {"text": "good two", "label": "2"}] and len(rejects) == 3
    pq.write_table(pa.table({"body": ["p1", "p2"]}), tmp_path / "d.parquet")
    (tmp_path / "d.txt").write_text("t1\n\nt2\n")
    texts, rejects = read_texts([str(tmp_path / "d.*")], "body")
    assert [r["text"] for r in texts] == ["p1", "p2", "t1", "t2"] and rejects == []
    with pytest.raises(SystemExit, match="matches no file"):
        read_texts([str(tmp_path / "none*.jsonl")])


def labeled_file(path: Path, rows: int = 150) -> list[dict]:
    """Real Debian descriptions under field names of one's own, plus two malformed lines."""
    lines = (REPO / "data" / "debian-science.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    random.Random(0).shuffle(records)
    chosen = records[:rows]
    with path.open("w", encoding="utf-8") as f:
        for r in chosen:
            f.write(json.dumps({"body": r["text"], "topic": r["section"]}) + "\n")
        f.write('{"body": "unterminated\n{"topic": "math"}\n')
    return chosen


def commands_in_this_process(log: Path, threads: int, args: list[str]) -> float:
    """What `experiment.maskstream` does, in the test's own process: `python -m maskstream ARGS`'s main(),
    its output in `log`. Spares each of the command's stats, seeds, build and train runs a process start
    (Beam's and torch's imports, seconds each); tests/test_evaluate.py's resume test runs them as real
    subprocesses."""
    import contextlib
    import time

    from maskstream.cli import main

    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("a", encoding="utf-8") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(args)
    assert code == 0, log.read_text(encoding="utf-8")[-3000:]
    return time.perf_counter() - started


@pytest.mark.slow
def test_the_command_on_a_labeled_file_of_ones_own(tmp_path: Path, tiny_bert: str, monkeypatch) -> None:
    from maskstream.cli import main
    from maskstream.evaluate import experiment

    monkeypatch.setattr(experiment, "maskstream", lambda args, log, threads: commands_in_this_process(log, threads,
                                                                                                      args))
    chosen = labeled_file(tmp_path / "mine.jsonl")
    args = ["evaluate", "--labeled", str(tmp_path / "mine.jsonl"), "--text-field", "body", "--label-field", "topic",
            "--model", tiny_bert, "--output", str(tmp_path / "out"), "--passes", "1", "--seeds", "0-1",
            "--probe-folds", "3", "--batch-size", "8", "--max-length", "64"]
    assert main(args) == 0
    results = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    prepared = next(r for r in results if r["kind"] == "prepared")
    # every document counted: read = kept + rejected, and the rejects say why
    assert prepared["labeled"] == {"read": 152, "kept": 150, "rejected": 2, "file": "mine.jsonl"}
    work = next((tmp_path / "out" / "work").glob("*/prepared.json")).parent  # under a hash of the inputs
    assert len((work / "rejects.jsonl").read_text().splitlines()) == 2
    # every labeled text is judged once, by fold, and no TAPT corpus holds a near-duplicate of its judged texts
    judged = [t for fold in prepared["truth"] for t in fold]
    assert len(judged) == 150 and sorted(judged) == sorted(r["section"] for r in chosen)
    assert sum(prepared["leaks_after_cleaning"].values()) == 0
    for fold in (0, 1):
        tapt = [json.loads(line)["text"] for line in
                (work / f"fold{fold}" / "tapt.jsonl").read_text().splitlines()]
        mine = [json.loads(line) for line in (work / "labeled.jsonl").read_text().splitlines()]
        assert not neardup.with_near_duplicate(tapt, [r["text"] for r in mine if r["fold"] == fold])
    arms = sorted((r["arm"], r["seed"]) for r in results if r["kind"] == "arm")
    assert arms == [("difference", 0), ("difference", 1), ("none", None), ("random", 0), ("random", 1)]
    for r in results:
        if r["kind"] == "arm":
            assert [len(f["predictions"]) for f in r["folds"]] == [len(fold) for fold in prepared["truth"]]
            assert [len(f["probabilities"]["values"]) for f in r["folds"]] == [len(fold) for fold in prepared["truth"]]
    report = (tmp_path / "out" / "REPORT.md").read_text()
    assert "`difference − random` | primary | 2 |" in report
    assert "**Decision:** Exploratory, no decision: 2 seeds, and a decision needs 5 or more" in report
    assert "**The control" in report and "P(difference − random > 0) in the bootstrap" in report
    assert "True label's log-probability under the probe" in report
    assert [p.stat().st_size > 1000 for p in (tmp_path / "out").glob("differences-*.png")] == [True]
    # a rerun finds everything done: prepared data reused, no new line
    [record] = (tmp_path / "out" / "work").glob("*/prepared.json")
    prepared_at = record.stat().st_mtime_ns
    assert main(args) == 0
    assert len((tmp_path / "out" / "results.jsonl").read_text().splitlines()) == len(results)
    assert record.stat().st_mtime_ns == prepared_at
    # --steps: every TAPT runs that many steps whatever its fold's size, on the same prepared data
    rows = {f: json.loads((work / "prepared.json").read_text())["datasets"][str(f)]["main"]["rows"] for f in (0, 1)}
    steps_args = [a if a != str(tmp_path / "out") else str(tmp_path / "steps") for a in args]
    steps_args[steps_args.index("--seeds") + 1] = "0"
    steps_args += ["--work", str(tmp_path / "out" / "work"), "--steps", "3", "--arms", "none,random"]
    assert main(steps_args) == 0 and record.stat().st_mtime_ns == prepared_at
    lines = [json.loads(line) for line in (tmp_path / "steps" / "results.jsonl").read_text().splitlines()]
    tapt = [r for r in lines if r["kind"] == "arm" and r["arm"] != "none"]
    assert len(tapt) == 1 and rows[0] != rows[1] and all(math.ceil(rows[f] / 8) != 3 for f in (0, 1))
    assert {(r["passes"], f["pretraining"]["steps"]) for r in tapt for f in r["folds"]} == {(None, 3)}
    assert "TAPT steps a fold (--steps): 3." in (tmp_path / "steps" / "REPORT.md").read_text()


@pytest.mark.slow
def test_an_evaluation_killed_mid_tapt_resumes_to_the_uninterrupted_result(tmp_path: Path, tiny_bert: str,
                                                                          monkeypatch) -> None:
    """A session that ends during an (arm, seed) loses neither the folds already read out nor the TAPT
    steps up to its last checkpoint: the TAPT process is SIGKILLed mid-fold, evaluate dies with it, and a
    rerun gives exactly the record of a run never stopped."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    from maskstream.cli import main
    from maskstream.evaluate import experiment

    labeled_file(tmp_path / "mine.jsonl", rows=120)

    def args(out: str) -> list[str]:
        return ["evaluate", "--labeled", str(tmp_path / "mine.jsonl"), "--text-field", "body", "--label-field",
                "topic", "--model", tiny_bert, "--output", str(tmp_path / out), "--arms", "none,random",
                "--passes", "4", "--seeds", "0", "--probe-folds", "3", "--batch-size", "4", "--max-length", "64",
                "--work", str(tmp_path / "work")]  # one prepare for both runs

    def arm_line(out: str) -> dict:
        lines = [json.loads(line) for line in (tmp_path / out / "results.jsonl").read_text().splitlines()]
        return next(r for r in lines if r["kind"] == "arm" and r["arm"] == "random")

    run_subprocess = experiment.maskstream
    # the run never stopped runs the commands in this process; the stopped one, below, as subprocesses
    monkeypatch.setattr(experiment, "maskstream", lambda args, log, threads: commands_in_this_process(log, threads,
                                                                                                      args))
    assert main(args("uninterrupted")) == 0
    expected = arm_line("uninterrupted")
    [tapt] = (tmp_path / "work").glob("*/tapt")
    shutil.rmtree(tapt)  # what the second run trains, it trains again

    trained: list[str] = []

    def counted(command: list[str], log: Path, threads: int) -> float:
        if command[0] == "train":
            trained.append(log.name)
        return run_subprocess(command, log, threads)

    def killed_in_fold1(command: list[str], log: Path, threads: int) -> float:
        if command[0] != "train" or not log.name.endswith("-1.log"):
            return counted(command, log, threads)
        output = Path(command[command.index("--output") + 1])
        process = subprocess.Popen([sys.executable, "-m", "maskstream", *command], start_new_session=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + 300
        while not (output / "checkpoints" / "latest").exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert process.returncode == -signal.SIGKILL, "the fold's TAPT ended before it could be killed"
        raise SystemExit("killed with its TAPT")

    monkeypatch.setattr(experiment, "maskstream", killed_in_fold1)
    with pytest.raises(SystemExit, match="killed"):
        main(args("stopped"))
    assert trained == ["train-random-0-0.log"]
    with pytest.raises(StopIteration):  # no result line for the stopped (arm, seed)
        arm_line("stopped")

    monkeypatch.setattr(experiment, "maskstream", counted)
    trained.clear()
    assert main(args("stopped")) == 0
    assert trained == ["train-random-0-1.log"], "fold 0's readout is kept; only fold 1 trains again"
    record = arm_line("stopped")
    resumed_from = record["folds"][1]["pretraining"]["resumed_from_step"]
    assert resumed_from >= 1 and record["folds"][0]["pretraining"]["resumed_from_step"] is None
    assert resumed_from < record["folds"][1]["pretraining"]["steps"]
    # the same probe predictions and probabilities as the run never stopped: the resumed weights are exact
    for mine, theirs in zip(record["folds"], expected["folds"], strict=True):
        assert mine["predictions"] == theirs["predictions"] and mine["probabilities"] == theirs["probabilities"]
    assert record["macro_f1"] == expected["macro_f1"]


def test_a_general_corpus_holding_a_labeled_text_is_refused(tmp_path: Path, tiny_bert: str) -> None:
    from maskstream.cli import main

    chosen = labeled_file(tmp_path / "mine.jsonl", rows=40)
    (tmp_path / "general.jsonl").write_text(json.dumps({"text": chosen[5]["text"] + " Also."}) + "\n")
    with pytest.raises(SystemExit, match="near-duplicates of 1 labeled texts"):
        main(["evaluate", "--labeled", str(tmp_path / "mine.jsonl"), "--text-field", "body", "--label-field", "topic",
              "--model", tiny_bert, "--output", str(tmp_path / "out"), "--general-corpus",
              str(tmp_path / "general.jsonl")])


def test_the_seed_plan_follows_the_pre_registration(tmp_path: Path) -> None:
    from benchmarks.effect import ours

    def line(arm: str, seed: int, score: float, chash: str = "c1") -> str:
        return json.dumps({"kind": "arm", "config_hash": chash, "arm": arm, "seed": seed, "macro_f1": score})

    gaps = {1000: 0.010, 1001: -0.012, 1002: 0.025, 1003: 0.002}
    lines = [line("random", s, 0.80) for s in gaps] + [line("difference", s, 0.80 + g) for s, g in gaps.items()]
    lines.append(line("difference", 1003, 0.80 + 0.004))  # a rerun's line: the last one counts
    # The `none` arm trains nothing: its config hash is taken with 0 passes, another than the TAPT arms'
    # (as in the run's own variance lines), and the rule does not read it.
    lines.append(json.dumps({"kind": "arm", "config_hash": "c0", "arm": "none", "seed": None, "macro_f1": 0.7}))
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    plan = ours.seed_plan(tmp_path)
    sd = float(np.std([0.010, -0.012, 0.025, 0.004], ddof=1))
    assert plan["sd"] == pytest.approx(sd) and plan["variance_seeds"] == [1000, 1001, 1002, 1003]
    assert plan["seeds"] == min(max(statistics.seeds_for_power(0.01, sd), 8), 24)
    (tmp_path / "results.jsonl").write_text("\n".join(lines + [line("random", 1000, 0.7, "c2")]) + "\n")
    with pytest.raises(SystemExit, match="more than one evaluation"):
        ours.seed_plan(tmp_path)


def test_the_sections_seed_plan_follows_its_pre_registration(tmp_path: Path, monkeypatch) -> None:
    """Issue 61's rule (SECTIONS.md) on a made-up pilot: N is the seeds the hierarchical standard error
    needs for 80 % power at ±1 point (the 2-seed bootstrap's seed parts doubled), at least 5, at most what
    the budget left after the pilot affords; a file of two evaluations is refused."""
    from benchmarks.effect import sections_run
    from maskstream.evaluate.report import compare, load

    rng = np.random.default_rng(3)
    labels = ["a", "b", "c"]
    truth = [rng.choice(labels, 90).tolist(), rng.choice(labels, 80).tolist()]
    clusters = [rng.integers(0, 60, 90).tolist(), rng.integers(100, 150, 80).tolist()]

    def line(arm: str, seed: int | None, right: float, chash: str, seconds: float, base: str = "b") -> dict:
        folds = [{"fold": f, "predictions": [y if rng.random() < right else "a" for y in truth[f]],
                  "seconds": {"tapt": seconds, "probe": 10.0}} for f in (0, 1)]
        return {"kind": "arm", "base_hash": base, "config_hash": chash, "arm": arm, "seed": seed,
                "macro_f1": right, "folds": folds}

    def plan_for(tapt_seconds: float, extra: list[dict] = ()) -> tuple[dict, dict]:
        lines = [{"kind": "prepared", "base_hash": "b", "labels": labels, "truth": truth, "cluster_ids": clusters},
                 line("none", None, 0.5, "c0", 0.0)]
        lines += [line(arm, seed, right, "c1", tapt_seconds) for seed in (2000, 2001)
                  for arm, right in (("random", 0.7), ("difference", 0.72))]
        (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*lines, *extra]))
        kinds = load(tmp_path / "results.jsonl")
        boot = compare(kinds["prepared"][0], kinds["arm"], "difference", "random", 0.01, 2000)["bootstrap"]
        return sections_run.seed_plan(tmp_path), boot

    plan, boot = plan_for(100.0)
    doubled = {"texts": boot["components"]["texts"], "seeds": 2 * boot["components"]["seeds"],
               "seed_x_text": 2 * boot["components"]["seed_x_text"]}
    assert plan["components"] == pytest.approx(doubled)
    need = statistics.design_for_power(doubled, 2, 170, 0.01)["seeds"]
    per_seed = 2 * (2 * 100.0 + 2 * 10.0)  # both arms, two folds each
    spent, none = 2 * per_seed + 2 * 10.0, 2 * 10.0
    affordable = int((12 * 3600 - spent - none) // per_seed)
    assert plan["seconds_per_seed"] == pytest.approx(per_seed) and plan["affordable_seeds"] == affordable
    assert plan["seeds_for_power"] == need and plan["texts"] == 170
    assert plan["seeds"] == max(5, min(need if need is not None else 24, affordable, 24))
    assert plan["power_at_margin"] == pytest.approx(statistics.hierarchical_power(0.01, statistics.projected_variance(
        doubled, 2, 170, plan["seeds"], 170)))
    # the budget cuts N between 5 and the need; a run it cannot afford 5 seeds of still gets 5
    monkeypatch.setattr(sections_run, "design_for_power", lambda *args: {"seeds": 20, "texts": None})
    per_seed = 2 * (2 * 1290.0 + 2 * 10.0)
    cut, _ = plan_for(1290.0)
    assert cut["affordable_seeds"] == int((12 * 3600 - 2 * per_seed - 40) // per_seed) == 6 and cut["seeds"] == 6
    costly, _ = plan_for(3000.0)
    assert costly["affordable_seeds"] == 1 and costly["seeds"] == 5
    # lines of another evaluation are not counted; a second prepared evaluation is refused
    other, _ = plan_for(1290.0, [line("random", 2002, 0.1, "c1", 9999.0, base="other")])
    assert other["pilot_seeds"] == [2000, 2001] and other["seconds_per_seed"] == pytest.approx(per_seed)
    with pytest.raises(SystemExit, match="2 prepared evaluations"):
        plan_for(2500.0, [{"kind": "prepared", "base_hash": "other", "labels": labels, "truth": truth,
                           "cluster_ids": clusters}])


def test_the_model_every_arm_starts_from_is_the_same_in_two_evaluations(minilm_path, tmp_path):
    """The offline MiniLM has no MLM head: the one `float32_model` gives it is seeded, so two evaluations
    of the same model (two WORK folders) start their arms from identical weights. (Unseeded, the head's
    transform differed and `random` scored 74.97 in one run and 71.66 in the next, same seeds.)"""
    from safetensors.torch import load_file

    from maskstream.evaluate.experiment import float32_model

    first = load_file(str(float32_model(minilm_path, tmp_path / "a") / "model.safetensors"))
    second = load_file(str(float32_model(minilm_path, tmp_path / "b") / "model.safetensors"))
    assert first.keys() == second.keys() and any(key.startswith("cls.") for key in first)
    assert all(np.array_equal(first[key].numpy(), second[key].numpy()) for key in first)


def test_the_commands_evaluate_runs_know_every_flag_it_gives_them() -> None:
    """evaluate builds each command's arguments from the command's own option names (command_line): every
    arm's extra flags are options of their command, and a renamed or misspelled option fails here."""
    from maskstream.cli import command_line

    for arm in ARMS.values():
        for command, flags in (("stats", arm.stats), ("seeds", arm.seeds), ("build", arm.build), ("train", arm.train)):
            assert command_line(command, *flags)[1:] == list(flags)
    assert command_line("train", "--strategy", "random", batch_size=32, whole_word=True, model=None) == [
        "train", "--batch-size", "32", "--whole-word", "--strategy", "random"]
    assert command_line("stats", input=["a.jsonl", "b.jsonl"], output="s")[1:4] == ["--input", "a.jsonl", "b.jsonl"]
    with pytest.raises(ValueError, match=r"maskstream train has no option \['batchsize'\]"):
        command_line("train", batchsize=32)
    with pytest.raises(ValueError, match=r"maskstream build has no option \['--max-len'\]"):
        command_line("build", "--max-len", "128")


def test_the_prepared_work_and_every_result_are_keyed_on_the_builds_word_encoder(tmp_path, tiny_bert, monkeypatch):
    """Issue 74: the build inside evaluate scores words with its own encoder (the MiniLM), not with --model; a
    changed encoder reused the old work folder without a word. Now it enters prepare's inputs (the work
    folder's key and every result's base_hash)."""
    from maskstream.evaluate import experiment

    labeled_file(tmp_path / "mine.jsonl")
    config = EvaluateConfig(labeled=tmp_path / "mine.jsonl", output=tmp_path / "out", model=tiny_bert)
    monkeypatch.setattr(experiment, "default_model", lambda: tiny_bert)
    before = experiment.prepare_inputs(config)
    assert before["encoder"] == experiment.model_identity(tiny_bert) and before["encoder"]["sha256"]
    other = tmp_path / "other-encoder"
    shutil.copytree(tiny_bert, other)
    (other / "config.json").write_text((other / "config.json").read_text().replace("}", ', "note": 1}', 1))
    monkeypatch.setattr(experiment, "default_model", lambda: str(other))
    after = experiment.prepare_inputs(config)
    assert after["encoder"] != before["encoder"] and {k: v for k, v in after.items() if k != "encoder"} == {
        k: v for k, v in before.items() if k != "encoder"}

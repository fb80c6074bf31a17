"""The sharpness control and floor of the probability map, the signal diagnostics of a build
(checked against figures computed here from the shards with pyarrow and collections.Counter),
and the background-contrast seeds on the shipped corpus."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.optimize import brentq

from maskstream.cli import main
from maskstream.mask_signal.probability import SHARPENED, mask_probabilities_flat
from maskstream.mask_signal.words import words
from maskstream.pipelines.statistics.stop_words import ENGLISH_STOP_WORDS
from maskstream.schemas.manifest import load_manifest
from tests.pipelines.test_build import SEEDS, build_args, make_inputs

BACKGROUND = Path(__file__).resolve().parents[2] / "data" / "debian-background.jsonl.gz"


def random_batch(seed: int = 17):
    """64 sequences of 3..128 tokens, [CLS]/[SEP] at the ends, two tokens a word, some unknown words."""
    rng = np.random.default_rng(seed)
    similarity = rng.normal(0.2, 0.15, 400).astype(np.float32)
    similarity[:5] = 1.0
    lengths = rng.integers(3, 129, 64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(offsets[-1])
    special = np.zeros(n, np.int8)
    special[offsets[:-1]] = 1
    special[offsets[1:] - 1] = 1
    word_ids = np.concatenate([np.arange(length) // 2 for length in lengths]).astype(np.int32)
    word_index = rng.integers(-1, 400, n).astype(np.int32)
    word_ids[special == 1] = -1
    word_index[special == 1] = -1
    return word_ids, word_index, special, offsets, similarity


# sha256 of the float32 probabilities of `random_batch()` before the sharpness and floor existed
# (commit 0ff1c4e): the paper's setting must keep giving exactly these bytes.
BEFORE_SHARPNESS = {
    ("similarity", 1.0): "acc6485f4438439000c576765a1abd337e8d312534239e7fa2acf2407f721099",
    ("similarity", 0.9): "188cc389be5003bc2a75b6a373b173658ac5b380f7d429e093ea059bbe8f4b09",
    ("rank", 1.0): "4c9e5d5ac4268cadf6f9b465e7d2b25f6b698f068f2b69bb8136ac19d876ce1e",
    ("rank", 0.9): "e3d379ae9a16a9e3eb9a0a936b578414cc1ad4dc55a679d8cc517f4eeacdb9e4",
}


@pytest.mark.parametrize(("weighting", "alpha"), list(BEFORE_SHARPNESS))
def test_the_paper_setting_gives_the_same_bytes_as_before(weighting, alpha):
    p = mask_probabilities_flat(*random_batch(), budget=0.15, alpha=alpha, weighting=weighting, width=128,
                                sharpness=1.0, floor=0.0)
    assert hashlib.sha256(p.tobytes()).hexdigest() == BEFORE_SHARPNESS[(weighting, alpha)]


def _per_sequence(p, offsets):
    return [p[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


@pytest.mark.parametrize("sharpness", [1.0, 4.0, 16.0])
@pytest.mark.parametrize("floor", [0.0, 0.01, 0.05])
def test_sharpened_map_is_monotone_floored_exact_and_matches_a_root_finder(sharpness, floor):
    word_ids, word_index, special, offsets, similarity = random_batch()
    budget = 0.15
    p = mask_probabilities_flat(word_ids, word_index, special, offsets, similarity, budget=budget, width=128,
                                sharpness=sharpness, floor=floor)
    for i, row in enumerate(_per_sequence(p, offsets)):
        sl = slice(offsets[i], offsets[i + 1])
        valid, index = special[sl] == 0, word_index[sl]
        assert np.all(row[~valid] == 0) and np.all(row[valid] >= np.float32(floor)) and np.all(row <= 1)
        n = valid.sum()
        if n == 0:
            continue
        # Exact budget: the stored float32 values sum to budget * n (relative error <= 1e-6).
        assert abs(row.astype(np.float64).sum() - budget * n) <= 1e-6 * budget * n
        # Monotone: a token of a more similar word never gets less.
        known = valid & (index >= 0)
        s = similarity[index[known]]
        order = np.argsort(s, kind="stable")
        assert np.all(np.diff(row[known][order].astype(np.float64)) >= -1e-7)
        # Independent: solve sum(floor + (1 - floor) * min(1, c * q)) = budget * n for c with scipy.
        weights = np.where(known, np.maximum(similarity[np.maximum(index, 0)], 0) ** sharpness, 0.0)
        q = weights / weights.sum()
        if (q > 0).sum() * (1 - floor) + floor * n <= budget * n:
            continue  # the budget cannot be reached: every weighted token at 1 (see the module docstring)
        c = brentq(lambda c, q=q[valid], n=n: floor * n + (1 - floor) * np.minimum(1, c * q).sum() - budget * n,
                   0, 1e12, xtol=1e-14)
        expected = np.where(valid, floor + (1 - floor) * np.minimum(1, c * q), 0)
        np.testing.assert_allclose(row, expected, atol=2e-6)


def test_bad_sharpness_and_floor_are_refused():
    batch = random_batch()
    with pytest.raises(ValueError, match="sharpness"):
        mask_probabilities_flat(*batch, sharpness=0.0)
    with pytest.raises(ValueError, match="floor"):
        mask_probabilities_flat(*batch, budget=0.15, floor=0.2)
    assert main(["build", "--input", "x", "--stats", "x", "--seeds", "x", "--output", "x", "--floor", "0.5"]) == 2


@pytest.fixture(scope="module")
def sharpened_build(sample_corpus, tmp_path_factory, tiny_encoder):
    """A sharpened, floored build of 60 documents; the tiny encoder's similarities are as good as any for
    diagnostics recomputed from the shards."""
    folder = tmp_path_factory.mktemp("signal")
    inputs = make_inputs(sample_corpus, folder, 60)
    root = str(folder / "dataset")
    extra = ["--num-shards", "2", "--model", tiny_encoder, "--sharpness", str(SHARPENED["sharpness"]), "--floor", str(SHARPENED["floor"])]
    assert main(build_args(inputs, root, *extra)) == 0
    version_url, manifest = load_manifest(root)
    return {"root": root, "version_url": version_url, "manifest": manifest, "inputs": inputs}


@pytest.mark.slow
def test_build_diagnostics_match_a_count_of_the_shards(sharpened_build):
    """Every figure of the manifest's diagnostics, recomputed from the shards with Counter."""
    manifest, version_url = sharpened_build["manifest"], sharpened_build["version_url"]
    report = manifest.diagnostics
    word_of = dict(zip(*pq.read_table(f"{version_url}/words", columns=["word_index", "word"]).to_pydict()
                       .values(), strict=True))
    tokens, masks = Counter(), Counter()
    outside_tokens, outside_masks, probabilities, budget_error = 0, 0.0, [], 0.0
    budget = manifest.config["budget"]
    for shard in manifest.shards:
        for row in pq.read_table(f"{version_url}/{shard.path}").to_pylist():
            kept = [(i, p) for i, s, p in zip(row["word_index"], row["special_tokens_mask"], row["mask_probability"],
                                              strict=True) if s == 0]
            for index, p in kept:
                probabilities.append(p)
                if index < 0:
                    outside_tokens, outside_masks = outside_tokens + 1, outside_masks + p
                else:
                    tokens[word_of[index]] += 1
                    masks[word_of[index]] += p
            budget_error = max(budget_error, abs(math.fsum(p for _, p in kept) - budget * len(kept)) / (budget * len(kept)))
    total_tokens, total_masks = sum(tokens.values()) + outside_tokens, math.fsum(masks.values()) + outside_masks

    def lift(group):
        share_t = sum(tokens[w] for w in group) / total_tokens
        return (math.fsum(masks[w] for w in group) / total_masks) / share_t

    groups = report["groups"]
    assert groups["seed_words"]["tokens"] == sum(tokens[w] for w in SEEDS)
    assert groups["seed_words"]["lift"] == pytest.approx(lift(SEEDS), rel=1e-6)
    stop = [w for w in tokens if w in ENGLISH_STOP_WORDS]
    assert groups["stop_words"]["lift"] == pytest.approx(lift(stop), rel=1e-6)
    assert groups["outside_words"]["tokens"] == outside_tokens
    assert report["tokens"] == total_tokens and report["expected_masks"] == pytest.approx(total_masks, rel=1e-9)
    shares = np.array(probabilities, np.float64) / total_masks
    entropy = -(shares[shares > 0] * np.log(shares[shares > 0])).sum()
    assert report["entropy_ratio"] == pytest.approx(entropy / math.log(total_tokens), rel=1e-9)
    assert [r["word"] for r in report["most_masked"][:10]] == [w for w, _ in sorted(
        masks.items(), key=lambda item: (-item[1], item[0]))[:10]]
    assert sum(report["histogram"]["counts"]) == total_tokens
    assert report["max_budget_error"] == pytest.approx(budget_error, abs=1e-9) and budget_error <= 1e-6
    # The floor: no non-special token below it.
    assert min(probabilities) >= np.float32(SHARPENED["floor"])


@pytest.mark.slow
def test_the_build_prints_its_diagnostics(sharpened_build, capsys):
    from maskstream.cli.build import print_signal

    print_signal(sharpened_build["version_url"])
    out = capsys.readouterr().out
    assert "masking signal" in out and "seed words" in out and "most expected masks" in out
    assert "reference (rank" in out and "paper (similarity" in out
    assert "budget: no sequence more than 1% below its masking budget" in out  # floor 0.01: none is short


def _version_with_diagnostics(sharpened_build, folder: Path, change) -> str:
    """A copy of the build's version whose manifest's diagnostics are `change(diagnostics)`."""
    import shutil

    copy = folder / "version"
    shutil.copytree(sharpened_build["version_url"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["diagnostics"] = change(manifest["diagnostics"])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return str(copy)


@pytest.mark.slow
def test_inspect_does_not_repeat_the_signal_the_build_printed(sharpened_build, tmp_path, capsys):
    """The shards give the manifest's figures: one line says so, and the table is not printed again."""
    plot = tmp_path / "hist.png"
    assert main(["inspect", sharpened_build["root"], "--plot", str(plot), "--samples", "1", "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert "the shards agree with the masking signal `maskstream build` printed" in out
    assert "seed words" not in out and "most expected masks" not in out and "reference (rank" not in out
    assert "vocabulary       min word count" not in out  # printed by the build with the signal
    assert (tmp_path / "hist_signal.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.parametrize("manifest_kind", ["older, without diagnostics", "figures that differ"])
def test_inspect_prints_the_signal_the_build_did_not(sharpened_build, tmp_path, capsys, manifest_kind):
    """An older manifest (no diagnostics) or one whose figures differ from the shards': the whole
    report, the three maps compared, and for a difference a note saying so."""
    def change(diagnostics):
        if manifest_kind.startswith("older"):
            return {}
        diagnostics["groups"]["seed_words"]["lift"] *= 1.01
        return diagnostics

    version = _version_with_diagnostics(sharpened_build, tmp_path, change)
    assert main(["inspect", version, "--plot", str(tmp_path / "hist.png"), "--samples", "1", "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert "seed words" in out and "stop words" in out and "entropy" in out and "vocabulary       min word" in out
    for name in ("built (similarity", "paper (similarity", "reference (rank", "sharpened (sharpness"):
        assert name in out
    assert ("differs from the figures in the manifest" in out) == (manifest_kind == "figures that differ")
    assert "the shards agree" not in out


@pytest.mark.slow
def test_a_near_uniform_map_is_warned_about(sharpened_build):
    """The paper's map on this slice: its diagnostics carry the warning naming the knobs."""
    from maskstream.pipelines.dataset.inspect.signal import signal_reports

    version_url, manifest = sharpened_build["version_url"], sharpened_build["manifest"]
    from maskstream.pipelines.dataset.core.signal_tallies import map_tallies

    word_table = pq.read_table(f"{version_url}/words")
    similarity = np.zeros(word_table.num_rows, np.float32)
    similarity[word_table.column("word_index").to_numpy()] = word_table.column("similarity").to_numpy()
    tallies = [map_tallies(pq.read_table(f"{version_url}/{s.path}"), similarity, manifest.config, manifest.total_rows)
               for s in manifest.shards]
    reports = signal_reports(tallies, word_table, manifest.seeds)
    paper = next(r for name, r in reports.items() if name.startswith("paper"))
    # The build recorded the same comparison in its manifest.
    recorded = manifest.diagnostics["comparison"]
    assert list(recorded) == list(reports)[1:]
    for name, figures in recorded.items():
        for group, shares in figures["groups"].items():
            assert shares == pytest.approx(reports[name]["groups"][group], rel=1e-9)
        assert figures["entropy_ratio"] == pytest.approx(reports[name]["entropy_ratio"], rel=1e-12)
    assert paper["entropy_ratio"] > reports[next(n for n in reports if n.startswith("sharpened"))]["entropy_ratio"]
    assert paper["warning"] and "--sharpness" in paper["warning"]


@pytest.mark.slow
def test_comparison_maps_are_tallied_on_every_kth_sequence(sharpened_build, monkeypatch):
    """With k = 3 the built map is still tallied on every row, and each compared map on exactly the
    rows whose sequence id is a multiple of 3 (counted here with numpy), as a full tally of those rows."""
    from maskstream.pipelines.dataset.core import signal_tallies as signal

    version_url, manifest = sharpened_build["version_url"], sharpened_build["manifest"]
    word_table = pq.read_table(f"{version_url}/words")
    similarity = np.zeros(word_table.num_rows, np.float32)
    similarity[word_table.column("word_index").to_numpy()] = word_table.column("similarity").to_numpy()
    rows = pa.concat_tables(pq.read_table(f"{version_url}/{s.path}") for s in manifest.shards)
    total = manifest.total_rows
    full = signal.map_tallies(rows, similarity, manifest.config, total)
    monkeypatch.setattr(signal, "COMPARISON_SEQUENCES", total // 3)
    assert signal.comparison_stride(total) == 3
    sampled = signal.map_tallies(rows, similarity, manifest.config, total)
    built, *compared = full
    assert list(sampled) == list(full)
    for key, value in full[built].items():
        np.testing.assert_array_equal(sampled[built][key], value)
    subset = rows.filter(pa.array(rows.column("sequence_id").to_numpy() % 3 == 0))
    assert 0 < subset.num_rows < rows.num_rows
    subset_tokens = int((subset.column("special_tokens_mask").combine_chunks().flatten().to_numpy() == 0).sum())
    monkeypatch.setattr(signal, "COMPARISON_SEQUENCES", total + 1)
    of_subset = signal.map_tallies(subset, similarity, manifest.config, total)
    for name in compared:
        assert sampled[name]["tokens"].sum() + sampled[name]["other"][0] == subset_tokens
        for key, value in of_subset[name].items():
            np.testing.assert_array_equal(sampled[name][key], value)


@pytest.fixture(scope="module")
def background_stats(sample_corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("background")
    assert main(["stats", "--input", str(sample_corpus), "--background-input", str(BACKGROUND),
                 "--output", str(folder / "stats")]) == 0
    seeds = {}
    for contrast in ("background", "general"):
        assert main(["seeds", "--stats", str(folder / "stats"), "--output", str(folder / f"{contrast}.json"),
                     "--contrast", contrast]) == 0
        seeds[contrast] = [row["word"] for row in json.loads((folder / f"{contrast}.json").read_text())["seeds"]]
    return {"folder": folder, "seeds": seeds}


@pytest.fixture(scope="module")
def background_counts() -> Counter:
    """The background's words, counted here with Counter."""
    counts = Counter()
    with gzip.open(BACKGROUND, "rt", encoding="utf-8") as f:
        for line in f:
            counts.update(words(json.loads(line)["text"]))
    return counts


@pytest.mark.slow
def test_background_contrast_seeds_are_domain_words(background_stats, background_counts):
    """At most 2 of the top 20 seeds are among the background's 300 most common words; TF-ICF
    alone picks many of them."""
    counts = background_counts
    common = {w for w, _ in counts.most_common(300)}
    background, general = background_stats["seeds"]["background"], background_stats["seeds"]["general"]
    assert len(background) == 20 and len([w for w in background if w in common]) <= 2
    assert len([w for w in general if w in common]) >= 10


@pytest.mark.slow
def test_background_report_says_which_contrast_put_each_seed_there(background_stats, background_counts):
    folder = background_stats["folder"]
    table = pa.concat_tables(pq.read_table(p) for p in sorted((folder / "stats").glob("word_stats-*.parquet")))
    rows = {r["word"]: r for r in table.to_pylist()}
    total = sum(r["tf"] for r in rows.values())
    background_total = json.loads((folder / "stats" / "summary.json").read_text())["background"]["total_words"]
    counts = background_counts
    assert sum(counts.values()) == background_total
    seed = rows[background_stats["seeds"]["background"][0]]
    f_b = counts[seed["word"]] / background_total
    assert seed["background_frequency"] == pytest.approx(f_b)
    assert seed["contrast"] == pytest.approx(seed["tf_icf"] * math.log((seed["tf"] / total) / f_b))
    assert rows["package"]["contrast"] == 0.0  # more frequent in the background than in the domain
    report = (folder / "background_report.md").read_text()
    assert "put there by" in report and "background + general" in report and "| package |" in report


@pytest.mark.slow
def test_seeds_json_records_which_contrast_put_each_seed_there(background_stats):
    """Each seed's rank, domain frequency, score, rank by TF-ICF alone among the words the filters
    keep (computed here), and `put_there_by`, which `inspect --html` shows."""
    folder = background_stats["folder"]
    rows = pa.concat_tables(pq.read_table(p) for p in sorted((folder / "stats").glob("word_stats-*.parquet"))).to_pylist()
    total = sum(r["tf"] for r in rows)
    kept = [r for r in rows if r["df"] >= 3 and r["word"] not in ENGLISH_STOP_WORDS and r["word"].isalpha()
            and len(r["word"]) >= 3]
    tf_icf_rank = {r["word"]: n for n, r in enumerate(sorted(kept, key=lambda r: (-r["tf_icf"], r["word"])), start=1)}
    by = Counter()
    for contrast, score in (("background", "contrast"), ("general", "tf_icf")):
        seeds = json.loads((folder / f"{contrast}.json").read_text())["seeds"]
        for rank, seed in enumerate(seeds, start=1):
            assert seed["rank"] == rank and seed["tf_icf_rank"] == tf_icf_rank[seed["word"]]
            assert seed["domain_frequency"] == pytest.approx(seed["tf"] / total)
            assert seed["score_name"] == score and seed["score"] == seed[score]
            expected = "general" if contrast == "general" else (
                "background + general" if tf_icf_rank[seed["word"]] <= 20 else "background")
            assert seed["put_there_by"] == expected
            by[seed["put_there_by"]] += 1
    assert by["general"] == 20 and by["background"] >= 1 and by["background + general"] >= 1

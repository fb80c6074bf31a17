"""A measured cost model: tokens/s per core for each stage, the vocabulary's growth, and what
they project for a large corpus.

    python -m benchmarks.cost_model [--corpus DEBIAN.jsonl] [--fractions 1,2,3] [--work DIR]
                                    [--project-gb 100] [--workers 10,50]

Corpus: the full Debian descriptions (benchmarks/debian_corpus.py, about 62k documents, made now
unless --corpus is given), cut into thirds of *distinct* text: x1 is the first third, x2 the first
two, x3 all of it (repeating one text would hide the vocabulary's growth).

Every contender runs on one core (RAYON_NUM_THREADS, OMP_NUM_THREADS, MKL_NUM_THREADS = 1 and one
DirectRunner worker), so each figure is per core:

- read: `maskstream.pipelines.corpus.FileParser` over the JSONL (parsing, validation, rejects), in process;
- count: `word_counts_of_texts` over batches of documents plus summing into one Counter (the work of
  `maskstream stats`' CountWords, without Beam's shuffle), in process; whole stats: the wall time
  of `maskstream stats` itself (the projection uses this one);
- tokenize, mask_probability, signal, write, encode: the Beam counters of `maskstream build`
  (each DoFn times its own work), run as a subprocess; "Beam and the rest" is the build's wall
  time minus those stages, timed the same way (reading again, windows, shuffles, the word table,
  start-up); with
  two builds, the marginal row (their difference) is what one more token costs, free of start-up;
- the vocabulary: word types vs tokens (the `stats` word definition, `collections.Counter`),
  fitted by Heaps' law types = K * tokens^beta over the fractions.

Then, in the same run:

- the encoder in float32 and in the runtime the build chooses here (`--encoder-dtype auto`:
  bfloat16 where the CPU computes it natively, else float32), beside the fastest alternative
  measured by benchmarks/encoder_runtime.py (ONNX Runtime, int8 dynamic), over every word type of
  the whole corpus: words/s, Spearman of the nearest-seed similarities with float32's, top-1 %
  overlap (the acceptance for a new default: >= 2x, Spearman >= 0.995, overlap >= 0.98);
- the update ratio: all but the last eleventh of the corpus split into 10 files, a first `maskstream
  update`, then one file replaced by that last eleventh (new text) and `update` again, each a
  fresh process on one core; the second's wall time over the first's (target <= 0.25) and its
  steps (the update's report).

Then the projection for --project-gb of text of the same kind: tokens from the measured bytes per
token, CPU-hours per stage from the per-core rates, encoder hours from the types the Heaps fit
gives, and wall time and cost on N Dataflow workers from the assumptions printed with it (list
prices and machine type are assumptions to check against today's price list; the per-core rates are
this machine's, not Dataflow's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
ONE_CORE = {"RAYON_NUM_THREADS": "1", "RAYON_RS_NUM_CPUS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}
# Assumptions of the projection (printed with it). Dataflow batch list prices, us-central1, per hour.
VCPU_HOUR_USD = 0.056
GB_HOUR_USD = 0.003557
SHUFFLE_GB_USD = 0.011
WORKER_VCPUS = 4  # n1-standard-4
WORKER_GB = 15
WORKER_START_S = 240  # Dataflow worker VMs start in a few minutes; counted once per job
BUILD_STAGES = ("tokenize", "mask_probability", "signal", "write", "encode")
STAGE_NAMES = {"stats_wall": "stats (read, count, combine: the whole pipeline)", "beam": "Beam and the rest (build)",
               "encode": "encode word types"}


def run_maskstream(*args: str, env: dict[str, str]) -> tuple[str, float, float, float]:
    """(stdout, wall seconds, CPU seconds, peak RSS GB of that process) of `maskstream ARGS` in a fresh process."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, "-m", "maskstream", "--log-level", "WARNING", *args], env=env,
                                 stdout=out, stderr=err, text=True, cwd=REPO_ROOT)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0), err.seek(0)
        if child.returncode != 0:
            sys.exit(f"maskstream {args[0]} failed:\n{err.read()[-4000:]}")
        return out.read(), wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024**2


def read_seconds(path: Path) -> tuple[list, float]:
    """(documents, seconds) of the corpus reader (FileParser) over one JSONL file, in this process."""
    from maskstream.pipelines.corpus import Document, FileParser

    started = time.perf_counter()
    documents = [d for d in FileParser().records(str(path)) if isinstance(d, Document)]
    return documents, time.perf_counter() - started


def count_seconds(documents: list) -> tuple[Counter, float]:
    """(word -> occurrences, seconds) of the stats' counting, batches of about BATCH_CHARACTERS characters
    as `CountWords` makes them, plus one global sum."""
    from maskstream.pipelines.statistics.counting import word_counts_of_texts
    from maskstream.pipelines.statistics.stats_transforms import BATCH_CHARACTERS

    started = time.perf_counter()
    total: Counter = Counter()
    batch: list[str] = []
    size = 0
    for text in [d.text for d in documents] + [None]:  # None: the end, the last batch is counted
        if text is None or (batch and size + len(text) > BATCH_CHARACTERS):
            for word, (count, _) in word_counts_of_texts(batch):
                total[word] += count
            batch, size = [], 0
        if text is not None:
            batch.append(text)
            size += len(text)
    return total, time.perf_counter() - started


def heaps_fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """(K, beta) of types = K * tokens^beta, least squares in log-log."""
    xs = [math.log(t) for t, _ in points]
    ys = [math.log(v) for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return math.exp(my - beta * mx), beta


def update_after_one_of_ten_changed(lines: list[str], work: Path, env: dict[str, str]) -> dict:
    """Wall seconds of a first `maskstream update` of 10 files and of the update after one of them got new text."""
    from benchmarks.incremental import replace_text, split_into_files, update_report

    documents = [line.rstrip("\n") for line in lines]
    used = documents[: len(documents) * 10 // 11]
    paths = split_into_files(used, 10, work / "update-corpus")
    pattern, root = str(work / "update-corpus" / "*.jsonl"), str(work / "update-root")
    _, first_s, _, _ = run_maskstream("update", "--input", pattern, "--output", root, env=env)
    replace_text(paths[:1], documents[len(used) :])
    stdout, again_s, _, _ = run_maskstream("update", "--input", pattern, "--output", root, env=env)
    report = update_report(stdout)
    return {"documents": len(used), "first_s": first_s, "again_s": again_s, "steps": report["seconds"],
            "files_processed": report["counts"].get("files_processed"), "words_encoded": report["counts"].get("words_encoded")}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=None, help="Debian JSONL corpus (default: made with debian_corpus.py)")
    parser.add_argument("--fractions", default="1,2,3", help="thirds of the corpus to measure (default: 1,2,3)")
    parser.add_argument("--build-fractions", default="1,3", help="thirds to run the build on (default: 1,3)")
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--project-gb", type=float, default=100.0, help="corpus size to project (default: 100)")
    parser.add_argument("--workers", default="10,50", help="Dataflow worker counts to project (default: 10,50)")
    return parser.parse_args()


def measure_third(third: int, lines: list[str], work: Path, env: dict[str, str], build: bool) -> dict:
    """The first `third` thirds of the corpus: read and count rates, the vocabulary, and with `build`
    the stats, seeds and build runs (their stage counters) beside the HF tokenizer alone."""
    from benchmarks.build import tokenizer_alone  # the peer, as benchmarks/build.py runs it
    from maskstream.models import default_model
    from maskstream.schemas.manifest import load_manifest

    part = work / f"corpus-x{third}.jsonl"
    part.write_text("".join(lines[: len(lines) * third // 3]), encoding="utf-8")
    documents, read_s = read_seconds(part)
    counts, count_s = count_seconds(documents)
    text_bytes = sum(len(d.text.encode("utf-8")) for d in documents)
    row = {"corpus": f"x{third}", "documents": len(documents), "text_mb": text_bytes / 1e6,
           "words": sum(counts.values()), "types": len(counts),
           "types_once": sum(1 for c in counts.values() if c == 1),
           "read_s": read_s, "count_s": count_s}
    if build:
        stats, seeds, root = work / f"stats-x{third}", work / f"seeds-x{third}.json", work / f"dataset-x{third}"
        _, stats_wall, _, _ = run_maskstream("stats", "--input", str(part), "--output", str(stats), env=env)
        run_maskstream("seeds", "--stats", str(stats), "--output", str(seeds), env=env)
        stdout, wall, cpu, peak_gb = run_maskstream("build", "--input", str(part), "--stats", str(stats),
                                                    "--seeds", str(seeds), "--output", str(root), env=env)
        report = json.loads(stdout[: stdout.rindex("}") + 1])
        _, manifest = load_manifest(str(root))
        stages = {s: report["stage_cpu_s"].get(s, 0.0) for s in BUILD_STAGES}
        peer_tokens, peer_s = tokenizer_alone([d.text for d in documents], default_model())
        row.update(peer_tokens=peer_tokens, peer_s=peer_s, tokens=manifest.total_tokens, stats_wall_s=stats_wall,
                   build_wall_s=wall, build_cpu_s=cpu, peak_gb=peak_gb,
                   encoded_types=report["counts"].get("encoded_words", 0), **{f"{s}_s": v for s, v in stages.items()},
                   beam_s=wall - sum(stages.values()), build_rest_s=wall - stages["encode"])
    return row


def measure_encoders(whole: Path) -> tuple[int, str, list[dict]]:
    """(word types, the build's runtime choice here, runtimes compared) over every word type of `whole`."""
    from benchmarks.encoder_runtime import compare_runtimes, vocabulary_and_seeds
    from maskstream.models import default_model
    from maskstream.pipelines.dataset.core.encoder_dtype import resolve_encoder_dtype

    vocabulary, seeds = vocabulary_and_seeds(whole)
    chosen = "torch bfloat16 autocast" if resolve_encoder_dtype("cpu", "auto") == "bfloat16" else "torch float32"
    print(f"encoder runtimes over the {len(vocabulary):,} word types of {whole.name}, one thread; "
          f"the build's choice here (--encoder-dtype auto): {chosen}", flush=True)
    return len(vocabulary), chosen, compare_runtimes(vocabulary, seeds, default_model(),
                                                     [chosen, "onnxruntime int8 dynamic"])


def per_core_rows(rows: list[dict]) -> list[tuple[str, dict]]:
    """(name, row) of each build, and the marginal row: what one more token costs, the difference
    of the first and last builds, free of the fixed start-up."""
    per_core = [(r["corpus"], r) for r in rows if "tokens" in r]
    if len(per_core) > 1:
        a, b = per_core[0][1], per_core[-1][1]
        per_core.append((f"marginal {b['corpus']} - {a['corpus']}",
                         {k: b[k] - a[k] for k in ("tokens", "peer_tokens", "peer_s", "stats_wall_s", "build_wall_s",
                                                   "build_rest_s", "beam_s", "read_s", "count_s",
                                                   *(f"{s}_s" for s in BUILD_STAGES))}
                         | {"encoded_types": b["encoded_types"], "encode_s": b["encode_s"]}))
    return per_core


def rate(tokens: float, seconds: float) -> str:
    return f"{tokens / seconds:,.0f}" if seconds > 0 else "-"


def print_throughput(rows: list[dict], per_core: list[tuple[str, dict]]) -> None:
    print("\n## Throughput by stage on one core (tokens/s; encode in word types/s)\n")
    print("| corpus | tokens | HF tokenizer alone (peer) | read | count | whole stats | tokenize | mask probability "
          "| signal | write | Beam and the rest | whole build | build without encode | its ratio to the peer "
          "| encode (types/s) |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for name, r in per_core:
        t = r["tokens"]
        peer = r["peer_tokens"] / r["peer_s"]
        without_encode = t / r["build_rest_s"]
        print(f"| {name} | {t:,} | {peer:,.0f} | {rate(t, r['read_s'])} | {rate(t, r['count_s'])} "
              f"| {rate(t, r['stats_wall_s'])} "
              f"| {rate(t, r['tokenize_s'])} "
              f"| {rate(t, r['mask_probability_s'])} | {rate(t, r['signal_s'])} | {rate(t, r['write_s'])} "
              f"| {rate(t, r['beam_s'])} | {rate(t, r['build_wall_s'])} | {without_encode:,.0f} "
              f"| {without_encode / peer:.2f} | {rate(r['encoded_types'], r['encode_s'])} |")
    print("\n| corpus | documents | text MB | word types encoded | build wall s | build CPU s | peak RSS GB |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        if "tokens" in r:
            print(f"| {r['corpus']} | {r['documents']:,} | {r['text_mb']:.1f} | {r['encoded_types']:,} "
                  f"| {r['build_wall_s']:.1f} | {r['build_cpu_s']:.1f} | {r['peak_gb']:.2f} |")


def print_encoders(types: int, whole: Path, chosen: str, runtimes: list[dict]) -> None:
    print(f"\n## Encoder runtimes, one thread, over the {types:,} word types of {whole.name}\n")
    print("| runtime | words/s | vs float32 | Spearman vs float32 | top-1 % overlap |")
    print("|---|--:|--:|--:|--:|")
    for r in runtimes:
        label = r["runtime"] + (" (the build's choice here)" if r["runtime"] == chosen else "")
        print(f"| {label} | {r['words_per_s']:,.0f} | {r['speed']:.2f}x | {r['spearman']:.4f} | {r['top_overlap']:.3f} |")


def print_update(update: dict) -> None:
    ratio = update["again_s"] / update["first_s"]
    print(f"\n## Update after 1 of 10 files changed ({update['documents']:,} documents, one core)\n")
    print(f"first update {update['first_s']:.1f} s; after one file got new text {update['again_s']:.1f} s "
          f"= {ratio:.3f}x the first (target <= 0.25); {update['files_processed']} file tokenized, "
          f"{update['words_encoded']:,} new words encoded; its steps (s): {json.dumps(update['steps'])}")


def print_side_by_side(rows: list[dict], per_core: list[tuple[str, dict]], runtimes: list[dict], update: dict) -> None:
    """Issue 20's figures beside their targets."""
    builds = [r for r in rows if "tokens" in r]
    if not builds:
        return
    print("\n## Side by side (issue 20)\n")
    print("| figure | measured | target |")
    print("|---|--:|---|")
    for r in builds:
        print(f"| whole build {r['corpus']} / HF tokenizer, tokens/s | "
              f"{(r['tokens'] / r['build_wall_s']) / (r['peer_tokens'] / r['peer_s']):.3f} | |")
    if len(per_core) > len(builds):
        name, m = per_core[-1]
        print(f"| build without encode, {name} / HF tokenizer, tokens/s | "
              f"{(m['tokens'] / m['build_rest_s']) / (m['peer_tokens'] / m['peer_s']):.3f} | >= 0.85 |")
    for r in runtimes:
        print(f"| encoder {r['runtime']}: words/s; vs float32; Spearman; top-1 % | {r['words_per_s']:,.0f}; "
              f"{r['speed']:.2f}x; {r['spearman']:.4f}; {r['top_overlap']:.3f} "
              f"| a new default: >= 2x, >= 0.995, >= 0.98 |")
    print(f"| update after 1 of 10 files / first update | {update['again_s'] / update['first_s']:.3f} | <= 0.25 |")
    names = " / ".join(r["corpus"] for r in builds)
    peaks = " / ".join(f"{r['peak_gb']:.2f}" for r in builds)
    word_types = " / ".join(f"{r['types']:,}" for r in builds)
    print(f"| peak RSS of the build, {names} (GB) | {peaks} | grows with the word types ({word_types}), not the tokens |")


def print_vocabulary(rows: list[dict]) -> tuple[float, float, float, float] | None:
    """The vocabulary's growth; returns the Heaps fits (K, beta) of all types and of types seen twice
    or more, None with a single fraction."""
    print("\n## Vocabulary growth (stats' words, collections.Counter)\n")
    print("| corpus | word occurrences | types | types seen once | share seen once "
          "| occurrences of types seen twice or more (`--min-word-count 2` coverage) |")
    print("|---|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['corpus']} | {r['words']:,} | {r['types']:,} | {r['types_once']:,} | {r['types_once'] / r['types']:.2f} "
              f"| {1 - r['types_once'] / r['words']:.2%} |")
    if len(rows) < 2:
        return None
    k, beta = heaps_fit([(r["words"], r["types"]) for r in rows])
    k2, beta2 = heaps_fit([(r["words"], r["types"] - r["types_once"]) for r in rows])
    print(f"\nHeaps' law fit: types = {k:.2f} * words^{beta:.3f}; types seen twice or more = {k2:.2f} * words^{beta2:.3f}")
    return k, beta, k2, beta2


def print_projection(args: argparse.Namespace, rows: list[dict], per_core: list[tuple[str, dict]],
                     fits: tuple[float, float, float, float]) -> None:
    """Core-hours per stage for --project-gb of text like this corpus, and wall time and cost on
    --workers Dataflow workers."""
    k, beta, k2, beta2 = fits
    last = [r for r in rows if "tokens" in r][-1]
    marginal = per_core[-1][1]
    bytes_per_token = last["text_mb"] * 1e6 / last["tokens"]
    words_per_token = last["words"] / last["tokens"]
    tokens = args.project_gb * 1e9 / bytes_per_token
    types = k * (tokens * words_per_token) ** beta
    types_repeated = k2 * (tokens * words_per_token) ** beta2
    core_hours = {s: tokens * marginal[f"{s}_s"] / marginal["tokens"] / 3600
                  for s in ("stats_wall", "tokenize", "mask_probability", "signal", "write", "beam")}
    types_per_s = last["encoded_types"] / last["encode_s"]
    core_hours["encode"] = types / types_per_s / 3600
    total = sum(core_hours.values())
    print(f"\n## Projection for {args.project_gb:g} GB of text like this corpus\n")
    print(f"{bytes_per_token:.2f} bytes/token -> {tokens / 1e9:.1f} G tokens; Heaps -> {types / 1e6:.1f} M word types, "
          f"all encoded by default; {types_repeated / 1e6:.1f} M with `--min-word-count 2` "
          f"({types_repeated / types_per_s / 3600:,.1f} core-hours of encoder instead of {core_hours['encode']:,.1f})")
    print("| stage | core-hours | share |")
    print("|---|--:|--:|")
    for s, h in sorted(core_hours.items(), key=lambda kv: -kv[1]):
        print(f"| {STAGE_NAMES.get(s, s)} | {h:,.1f} | {h / total:.0%} |")
    print(f"| total | {total:,.1f} | 100% |")
    # Shuffled: the documents once, then token rows twice (tokenized, then windows: ids, word ids,
    # word index and probability, 4 bytes each per token, uncompressed).
    shuffle_gb = args.project_gb + 2 * tokens * 16 / 1e9
    print(f"\nAssumptions: n1-standard-{WORKER_VCPUS} workers ({WORKER_VCPUS} vCPU, {WORKER_GB} GB), a vCPU as fast as "
          f"one core here, perfect scaling, {WORKER_START_S} s worker start-up, Dataflow batch list prices "
          f"${VCPU_HOUR_USD}/vCPU-h, ${GB_HOUR_USD}/GB-h, ${SHUFFLE_GB_USD}/GB shuffled, ~{shuffle_gb:g} GB shuffled.")
    print("| workers | wall hours | compute USD | shuffle USD | total USD |")
    print("|--:|--:|--:|--:|--:|")
    for n in (int(w) for w in args.workers.split(",")):
        hours = total / (n * WORKER_VCPUS) + WORKER_START_S / 3600
        compute = n * hours * (WORKER_VCPUS * VCPU_HOUR_USD + WORKER_GB * GB_HOUR_USD)
        shuffle = shuffle_gb * SHUFFLE_GB_USD
        print(f"| {n} | {hours:.1f} | {compute:,.0f} | {shuffle:,.0f} | {compute + shuffle:,.0f} |")


def main() -> int:
    args = parse_args()
    os.environ.update(ONE_CORE)
    from benchmarks.debian_corpus import corpus_or_made

    work = Path(args.work or tempfile.mkdtemp(prefix="maskstream-bench-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    source = corpus_or_made(args.corpus, work)
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    print(f"corpus: {len(lines)} documents, {sum(map(len, lines)) / 1e6:.1f} M characters of JSONL; one core per stage")

    thirds = sorted(int(f) for f in args.fractions.split(","))
    builds = {int(f) for f in args.build_fractions.split(",")}
    rows = []
    for third in thirds:
        rows.append(measure_third(third, lines, work, env, build=third in builds))
        print(json.dumps(rows[-1]), flush=True)
    whole = work / f"corpus-x{max(thirds)}.jsonl"
    types, chosen, runtimes = measure_encoders(whole)
    update = update_after_one_of_ten_changed(lines, work, env)
    print(json.dumps(update), flush=True)

    per_core = per_core_rows(rows)
    print_throughput(rows, per_core)
    print_encoders(types, whole, chosen, runtimes)
    print_update(update)
    print_side_by_side(rows, per_core, runtimes, update)
    fits = print_vocabulary(rows)
    if fits is not None and per_core:
        print_projection(args, rows, per_core, fits)
    return 0


if __name__ == "__main__":
    sys.exit(main())

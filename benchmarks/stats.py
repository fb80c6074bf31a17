"""Throughput and peak memory of `maskstream stats` against a plain `collections.Counter` pass.

    python -m benchmarks.stats [--skip-full] [--workers 2] [--corpus DEBIAN.jsonl] [--rounds R] [--skip-counter]

Corpora: the shipped sample (data/debian-science.jsonl) and the full Debian descriptions,
made now with benchmarks/debian_corpus.py from the apt lists (skipped where they are missing).
For each corpus, each contender runs as its own process (so that start-up is counted alike
and peak memory is that process's, from `os.wait4`: the largest resident set of the process
and of the worker processes it waited for, not their sum):

- `Counter`: one Python process reads the JSONL, splits words with `maskstream.mask_signal.words.words`
  (the same normalization) and counts tf and df with two `collections.Counter`s;
- `maskstream stats`: the Beam pipeline on the DirectRunner (one worker), and with
  `--direct_num_workers=N --direct_running_mode=multi_processing`.

Prints documents/s and words/s, and how many times slower than Counter each run is.

Then, on one core (RAYON_NUM_THREADS etc. = 1, one DirectRunner worker), `maskstream stats` beside
its peer, the model's HF fast tokenizer alone over the same texts (batched, as benchmarks/build.py
runs it), on the first third (x1) and the whole (x3) of the full Debian descriptions: the marginal
row (x3 - x1) is what one more token costs each side, free of start-up. --rounds R measures both
R times, sizes interleaved, and keeps each contender's fastest (a shared machine only slows runs down).
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
SAMPLE = REPO_ROOT / "data" / "debian-science.jsonl"


def counter_pass(path: Path) -> dict[str, int]:
    """The baseline: tf and df of every word, single process, same normalization."""
    from maskstream.mask_signal.words import words

    tf: Counter[str] = Counter()
    df: Counter[str] = Counter()
    documents = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            document_words = words(json.loads(line)["text"])
            tf.update(document_words)
            df.update(set(document_words))
            documents += 1
    return {"documents": documents, "distinct_words": len(tf), "total_words": sum(tf.values())}


def timed_process(command: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS in MiB of the process and the children it waited for, stdout)."""
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=stdout, stderr=stderr, text=True)
        # wait4 rather than wait(): it also returns the process's resource usage.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{stderr.read()[-3000:]}")
        return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss // 1024, stdout.read()


def tokenizer_seconds(path: Path, env: dict[str, str]) -> tuple[int, float, float]:
    """(tokens, wall seconds, CPU seconds) of the HF fast tokenizer alone over the texts of `path`, in its
    own process (the model's loading not counted)."""
    _, _, _, out = timed_process([sys.executable, __file__, "--tokenizer-pass", str(path)], env)
    tokens, wall, cpu = json.loads(out)
    return tokens, wall, cpu


def stats_vs_tokenizer(lines: list[str], work: Path, rounds: int, env: dict[str, str]) -> None:
    """Prints `maskstream stats`' tokens/s beside the tokenizer's on x1 and x3, and their marginal, one core
    each, by wall time and by CPU time (CPU time is what other processes on a shared machine disturb least)."""
    from benchmarks.cost_model import ONE_CORE

    env = {**env, **ONE_CORE}
    sizes = {"x1": work / "thirds-x1.jsonl", "x3": work / "thirds-x3.jsonl"}
    sizes["x1"].write_text("".join(lines[: len(lines) // 3]), encoding="utf-8")
    sizes["x3"].write_text("".join(lines), encoding="utf-8")
    clocks = ("peer_wall", "peer_cpu", "stats_wall", "stats_cpu")
    best: dict[str, dict[str, float]] = {name: dict.fromkeys(clocks, math.inf) for name in sizes}
    for round_ in range(rounds):
        for name, path in sizes.items():
            tokens, peer_wall, peer_cpu = tokenizer_seconds(path, env)
            stats_wall, stats_cpu, _, _ = timed_process(
                [sys.executable, "-m", "maskstream", "--log-level", "WARNING", "stats",
                 "--input", str(path), "--output", str(work / f"stats-{name}")], env)
            measured = dict(zip(clocks, (peer_wall, peer_cpu, stats_wall, stats_cpu), strict=True))
            best[name] = {"tokens": tokens, **{clock: min(best[name][clock], measured[clock]) for clock in clocks}}
            print(f"round {round_ + 1} {name}: {tokens} tokens, " + ", ".join(
                f"{clock} {seconds:.2f} s" for clock, seconds in measured.items()), file=sys.stderr, flush=True)
    a, b = best["x1"], best["x3"]
    best["marginal (x3 - x1)"] = {key: b[key] - a[key] for key in ("tokens", *clocks)}
    print(f"\nmaskstream stats vs the HF fast tokenizer alone on the same texts, one core each (fastest of "
          f"{rounds} round(s); throughput in the tokenizer's tokens per second; stats timed as a whole process, "
          "the tokenizer without loading it)\n")
    print("| corpus | tokens | tokenizer tok/s (wall) | stats tok/s (wall) | stats / tokenizer (wall) "
          "| tokenizer tok/s (CPU) | stats tok/s (CPU) | stats / tokenizer (CPU) |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for name, row in best.items():
        print(f"| {name} | {row['tokens']:,.0f} | {row['tokens'] / row['peer_wall']:,.0f} "
              f"| {row['tokens'] / row['stats_wall']:,.0f} | {row['peer_wall'] / row['stats_wall']:.2f}x "
              f"| {row['tokens'] / row['peer_cpu']:,.0f} | {row['tokens'] / row['stats_cpu']:,.0f} "
              f"| {row['peer_cpu'] / row['stats_cpu']:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-full", action="store_true", help="only the shipped sample (default: both)")
    parser.add_argument("--corpus", default=None,
                        help="the full Debian descriptions as JSONL (default: made with benchmarks/debian_corpus.py)")
    parser.add_argument("--workers", type=int, default=2, help="workers of the multi-processing run (default: 2)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of the comparison with the tokenizer; each side keeps its fastest (default: 1)")
    parser.add_argument("--skip-counter", action="store_true",
                        help="only the comparison with the tokenizer, not the one with collections.Counter")
    parser.add_argument("--counter-pass", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer-pass", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.counter_pass:  # the baseline's own process
        print(json.dumps(counter_pass(args.counter_pass)))
        return 0
    if args.tokenizer_pass:  # the peer's own process, its threads limited by the environment
        from benchmarks.build import tokenizer_alone
        from maskstream.models import default_model

        texts = [json.loads(line)["text"] for line in args.tokenizer_pass.open(encoding="utf-8")]
        from transformers import AutoTokenizer

        # tokenizer_alone loads the tokenizer before its clock starts: that load's CPU time is taken off.
        load_cpu = time.process_time()
        AutoTokenizer.from_pretrained(default_model())
        load_cpu = time.process_time() - load_cpu
        cpu = time.process_time()
        tokens, wall = tokenizer_alone(texts, default_model())
        print(json.dumps([tokens, wall, time.process_time() - cpu - load_cpu]))
        return 0

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    from benchmarks.debian_corpus import corpus_or_made

    rows = []
    with tempfile.TemporaryDirectory(prefix="maskstream-bench-") as tmp:
        corpora = [("sample", SAMPLE)]
        full = None
        if not args.skip_full:
            try:
                full = corpus_or_made(args.corpus, Path(tmp))
                corpora.append(("debian-full", full))
            except FileNotFoundError as e:
                print(f"full Debian corpus unavailable, skipped: {e}", file=sys.stderr)
        for name, path in [] if args.skip_counter else corpora:
            wall, _, rss, out = timed_process([sys.executable, __file__, "--counter-pass", str(path)], env)
            counts = json.loads(out)
            baseline = wall
            rows.append((name, counts, "Counter (1 process)", wall, rss, 1.0))
            runs = [("maskstream stats (DirectRunner)", []),
                    (f"maskstream stats ({args.workers} processes)",
                     [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_processing"])]
            for label, flags in runs:
                output = Path(tmp) / f"stats-{name}-{len(flags)}"
                command = [sys.executable, "-m", "maskstream", "--log-level", "WARNING", "stats",
                           "--input", str(path), "--output", str(output), *flags]
                wall, _, rss, _ = timed_process(command, env)
                summary = json.loads((output / "summary.json").read_text())
                # Same statistics as the baseline, or the comparison means nothing.
                assert (summary["N"], summary["distinct_words"], summary["total_words"]) == (
                    counts["documents"], counts["distinct_words"], counts["total_words"]), (summary, counts)
                rows.append((name, counts, label, wall, rss, wall / baseline))

        if full is not None:
            lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
            stats_vs_tokenizer(lines, Path(tmp), args.rounds, env)
    if not rows:
        return 0
    print(f"\nmaskstream stats vs a single-process collections.Counter pass ({os.cpu_count()} CPUs; "
          "wall time of each process, start-up included;\npeak RSS: the largest single process)\n")
    header = f"| {'corpus':<12} | {'documents':>9} | {'words':>10} | {'run':<34} | {'wall s':>7} | " \
             f"{'docs/s':>8} | {'words/s':>9} | {'peak RSS MiB':>12} | {'time vs Counter':>15} |"
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
    for name, counts, label, wall, rss, ratio in rows:
        print(f"| {name:<12} | {counts['documents']:>9} | {counts['total_words']:>10} | {label:<34} | {wall:>7.2f} | "
              f"{counts['documents'] / wall:>8.0f} | {counts['total_words'] / wall:>9.0f} | {rss:>12} | "
              f"{ratio:>14.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

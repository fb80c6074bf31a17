"""Throughput and peak memory of `maskstream stats` against a plain `collections.Counter` pass.

    python -m benchmarks.stats [--skip-full] [--workers 2]

Corpora: the shipped sample (data/debian-science.jsonl) and the full Debian descriptions,
made now with benchmarks/debian_corpus.py from the apt lists (skipped where they are missing).
For each corpus, each contender runs as its own process (so that start-up is counted alike
and peak memory is that process's, from `os.wait4`: the largest resident set of the process
and of the worker processes it waited for, not their sum):

- `Counter`: one Python process reads the JSONL, splits words with `schemas.words.words`
  (the same normalization) and counts tf and df with two `collections.Counter`s;
- `maskstream stats`: the Beam pipeline on the DirectRunner (one worker), and with
  `--direct_num_workers=N --direct_running_mode=multi_processing`.

Prints documents/s and words/s, and how many times slower than Counter each run is.
"""

from __future__ import annotations

import argparse
import json
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
    from schemas.words import words

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


def timed_process(command: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS in MiB of the process and the children it waited for, stdout)."""
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
        return wall, usage.ru_maxrss // 1024, stdout.read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-full", action="store_true", help="only the shipped sample (default: both)")
    parser.add_argument("--workers", type=int, default=2, help="workers of the multi-processing run (default: 2)")
    parser.add_argument("--counter-pass", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.counter_pass:  # the baseline's own process
        print(json.dumps(counter_pass(args.counter_pass)))
        return 0

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    rows = []
    with tempfile.TemporaryDirectory(prefix="maskstream-bench-") as tmp:
        corpora = [("sample", SAMPLE)]
        if not args.skip_full:
            full = Path(tmp) / "debian-all.jsonl"
            made = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "debian_corpus.py"), str(full)],
                                  capture_output=True, text=True)
            if made.returncode == 0 and full.exists():
                corpora.append(("debian-full", full))
            else:
                print(f"full Debian corpus unavailable, skipped: {made.stderr.strip()[-300:]}", file=sys.stderr)
        for name, path in corpora:
            wall, rss, out = timed_process([sys.executable, __file__, "--counter-pass", str(path)], env)
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
                wall, rss, _ = timed_process(command, env)
                summary = json.loads((output / "summary.json").read_text())
                # Same statistics as the baseline, or the comparison means nothing.
                assert (summary["N"], summary["distinct_words"], summary["total_words"]) == (
                    counts["documents"], counts["distinct_words"], counts["total_words"]), (summary, counts)
                rows.append((name, counts, label, wall, rss, wall / baseline))

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

"""The vocabulary at scale: `stats`, `seeds`, `build` and their Dataflow dry runs on millions of word types.

    python benchmarks/vocabulary_scale.py                       # 2 M word types (issue 28 item 7)
    python benchmarks/vocabulary_scale.py --word-types 20000    # a smoke test
    python benchmarks/vocabulary_scale.py --job-sizes 1000,100000,1000000,10000000

The default run writes a synthetic Zipf corpus (seeded, so the same bytes every time): word types
are lowercase strings of consonant-vowel syllables ("tabeko"; WordPiece cuts them into a few tokens),
the r-th most frequent occurs max(1, floor(C / r^s)) times with C set by --words, so every type
occurs at least once and the tail is made of words seen once, as in real text. Documents of about
100 words (sentences with capitals and full stops) are written as JSONL shards. Then, each as its
own `python -m maskstream` process: `stats`, `seeds`, `build --min-word-count N` (N such that only
about --encoded types are encoded, so the encoder's share stays small) on the DirectRunner, and the
Dataflow dry runs of `stats` and `build` (DataflowRunner --dry_run=True --no_auth: the job is built
offline, nothing is submitted). Every step also runs on a tiny corpus (--baseline-word-types) of the
same shape, and "bytes per word type" is the difference of the two peaks over the difference of
the two vocabularies: what each extra word type costs that process tree.

--job-sizes skips the corpus: for each size it writes a word-stats folder of that many synthetic
types directly (the table and summary.json `maskstream stats` writes), runs `seeds` on it, and the
build's dry run against the shipped corpus with about 1,000 types encoded, and prints the job's
size, transforms, the launcher's peak RSS and wall time beside the design before issue 28.

Peak memory is the process tree's: the proportional set size (PSS, so that pages a forked child
shares with its parent count once) of the launcher and every child (Beam workers, the tokenizer's
processes), sampled every 50 ms and summed, and never below the largest single process's own peak
RSS (`os.wait4`). Needs psutil (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from maskstream.models import default_model

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE = REPO_ROOT / "data" / "debian-science.jsonl"

# The design before issue 28 (the vocabulary as `beam.Create` of the launcher's word -> index dict),
# measured by the lead with main's code (commit d7fcd47) and the dry-run flags below: `maskstream
# build` on the shipped corpus, 1,000 encoded words, stats of N synthetic word types.
BEFORE_ISSUE_28 = {
    1_000: {"job_bytes": 217_452, "launcher_peak_mb": 443, "launcher_wall_s": 4.9},
    100_000: {"job_bytes": 1_173_132, "launcher_peak_mb": 550, "launcher_wall_s": 6.3},
    1_000_000: {"job_bytes": 10_212_515, "launcher_peak_mb": 1_173, "launcher_wall_s": 21.0},
    10_000_000: {"job_bytes": 100_849_157, "launcher_peak_mb": 6_115, "launcher_wall_s": 417.0},
}
BEFORE_ENCODED = 1_000  # the --job-sizes sweep encodes as many word types as those figures did
DATAFLOW_DRY_RUN = ["--runner=DataflowRunner", "--project", "my-project-123", "--region", "us-central1",
                    "--temp_location", "gs://mask-bucket/tmp", "--no_auth", "--dry_run=True"]
REMOTE_OUTPUT = "gs://mask-bucket"
DRY_RUN_LINE = re.compile(r"dry run: Dataflow job of ([\d,]+) bytes .*?, (\d+) transforms")

CONSONANTS = "bcdfghjklmnprstvwxyz"
VOWELS = "aeiou"
SYLLABLES = np.array([c + v for c in CONSONANTS for v in VOWELS])  # 100; a CV string splits one way only
SENTENCE_WORDS = (6, 18)  # words per sentence, uniform
DOCUMENT_WORDS = (80, 121)  # words per document, uniform: about 100


# ---------------------------------------------------------------------------------------------
# Synthetic vocabulary and corpus


def synthetic_words(count: int, seed: int) -> np.ndarray:
    """`count` distinct lowercase words, most frequent first: all 1-syllable words, then all
    2-syllable ones, ... each length class in a seeded random order, the last one a seeded sample."""
    rng = np.random.default_rng(seed)
    groups, syllables = [], 1
    while count > 0:
        size = len(SYLLABLES) ** syllables
        take = min(count, size)
        codes = rng.permutation(size)[:take] if size <= 10 * take else np.sort(
            rng.choice(size, take, replace=False))
        rng.shuffle(codes)
        word = SYLLABLES[codes % len(SYLLABLES)]
        for position in range(1, syllables):
            word = np.char.add(word, SYLLABLES[(codes // len(SYLLABLES) ** position) % len(SYLLABLES)])
        groups.append(word)
        count -= take
        syllables += 1
    return np.concatenate(groups)


def zipf_counts(word_types: int, total_words: int, exponent: float) -> np.ndarray:
    """Occurrences of the r-th word type, max(1, floor(C / r^exponent)), with the largest C whose
    total stays within `total_words` (at least one occurrence per type)."""
    if total_words < word_types:
        raise ValueError(f"--words ({total_words:,}) must be at least --word-types ({word_types:,})")
    inverse_rank = np.arange(1, word_types + 1, dtype=np.float64) ** -exponent

    def counts(head: float) -> np.ndarray:
        return np.maximum(1, np.floor(head * inverse_rank)).astype(np.int64)

    low, high = 1.0, float(total_words)
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if counts(middle).sum() <= total_words else (low, middle)
    return counts(low)


@dataclasses.dataclass(frozen=True)
class Corpus:
    pattern: str
    word_types: int
    words: int
    documents: int
    files: int
    counts: np.ndarray  # occurrences per word type, most frequent first


def write_zipf_corpus(folder: Path, word_types: int, total_words: int, *, shards: int = 8,
                      exponent: float = 1.0, seed: int = 0) -> Corpus:
    """A seeded Zipf corpus of `word_types` distinct words (each at least once) as JSONL shards
    `folder/part-XXXXX.jsonl`, one {"id", "text"} document of about 100 words a line."""
    rng = np.random.default_rng(seed)
    vocabulary = synthetic_words(word_types, seed)
    counts = zipf_counts(word_types, total_words, exponent)
    stream = rng.permutation(np.repeat(np.arange(word_types, dtype=np.int32), counts))
    lengths = rng.integers(*DOCUMENT_WORDS, size=len(stream) // DOCUMENT_WORDS[0] + 1)
    ends = np.cumsum(lengths)
    ends = np.append(ends[ends < len(stream)], len(stream))
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(folder / f"part-{i:05d}.jsonl", "w", encoding="utf-8"))
                   for i in range(shards)]
        start = 0
        for number, end in enumerate(ends):
            words = vocabulary[stream[start:end]].tolist()
            breaks = np.cumsum(rng.integers(*SENTENCE_WORDS, size=len(words) // SENTENCE_WORDS[0] + 1))
            for first, last in zip(np.concatenate([[0], breaks]), breaks, strict=False):
                if first >= len(words):
                    break
                words[first] = words[first].capitalize()
                last = min(last, len(words)) - 1
                words[last] += "."
            handles[number % shards].write(json.dumps({"id": f"doc-{number}", "text": " ".join(words)}) + "\n")
            start = end
    return Corpus(str(folder / "part-*.jsonl"), word_types, int(counts.sum()), len(ends), shards, counts)


def write_word_stats(folder: Path, word_types: int, *, exponent: float = 1.0, seed: int = 0,
                     rows_per_file: int = 1_000_000) -> np.ndarray:
    """A `maskstream stats` output folder of `word_types` synthetic words without a corpus:
    word_stats-*.parquet (maskstream.schemas.tables.WORD_STATS_SCHEMA) and summary.json. Returns tf per type."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from maskstream.schemas.formulas import FORMULA_VERSIONS, TF_ICF_UNSEEN_COUNT, WORDFREQ_RESOLUTION
    from maskstream.schemas.tables import WORD_STATS_SCHEMA

    tf = zipf_counts(word_types, 10 * word_types, exponent)
    total = int(tf.sum())
    documents = max(1, total // 100)
    # A word's documents: each occurrence in its own document, up to the number of documents.
    df = np.minimum(tf, documents)
    # General text lacks these words: f_G = 0, TF-ICF with the unseen floor (schemas/formulas.py).
    tf_icf = (tf / total) * np.log(1 / (TF_ICF_UNSEEN_COUNT * WORDFREQ_RESOLUTION))
    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = synthetic_words(word_types, seed)
    files = max(1, -(-word_types // rows_per_file))
    for part in range(files):
        rows = slice(part * rows_per_file, min(word_types, (part + 1) * rows_per_file))
        words = vocabulary[rows]
        table = pa.table({"word": pa.array(words.tolist(), pa.string()), "tf": tf[rows], "df": df[rows],
                          "general_frequency": np.zeros(len(words)), "tf_icf": tf_icf[rows]},
                         schema=WORD_STATS_SCHEMA)
        pq.write_table(table, folder / f"word_stats-{part:05d}-of-{files:05d}.parquet")
    summary = {
        "documents_read": documents, "documents_accepted": documents, "documents_rejected": 0, "N": documents,
        "distinct_words": word_types, "total_words": total, "general_source": "wordfreq:en",
        "config": {"input": ["synthetic"], "text_field": "text", "txt_mode": "line", "general_input": [],
                   "general_language": "en", "background_input": [], "unseen_count": TF_ICF_UNSEEN_COUNT},
        "formulas": dict(FORMULA_VERSIONS),
        "source_fingerprint": {"sha256": "synthetic", "files": 0},
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return tf


def min_word_count_for(counts: np.ndarray, encoded: int) -> tuple[int, int]:
    """(the --min-word-count that encodes about `encoded` of these types, how many it encodes)."""
    ordered = np.sort(counts)[::-1]
    threshold = int(ordered[min(encoded, len(ordered)) - 1])
    return threshold, int((counts >= threshold).sum())


# ---------------------------------------------------------------------------------------------
# Measured subprocesses


@dataclasses.dataclass
class Step:
    name: str
    returncode: int
    wall_s: float
    cpu_s: float  # user + system of the process and the children it waited for: stable on a busy machine
    peak_mb: float  # the process tree's peak: its summed PSS, at least the largest process's peak RSS
    largest_process_mb: float  # the largest single process's own peak (os.wait4)
    output: str

    def job(self) -> tuple[int, int] | None:
        """(job bytes, transforms) from a dry run's line, or None."""
        match = DRY_RUN_LINE.search(self.output)
        return (int(match.group(1).replace(",", "")), int(match.group(2))) if match else None


def run_measured(name: str, command: list[str], timeout_s: float) -> Step:
    """Runs `command` from the repository root; wall time and the peak RSS of its process tree."""
    import psutil

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with tempfile.TemporaryFile("w+") as output:
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            try:
                root = psutil.Process(proc.pid)
            except psutil.NoSuchProcess:
                return
            while not done.is_set():
                total = 0
                try:
                    for member in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.NoSuchProcess):
                            # PSS: a forked child's pages shared with its parent count once, not twice.
                            total += member.memory_full_info().pss
                except psutil.NoSuchProcess:
                    return
                peak[0] = max(peak[0], total)
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        killer = threading.Timer(timeout_s, proc.kill)
        killer.start()
        # wait4 rather than wait(): it also gives the largest resident set of the process and its children.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        killer.cancel()
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        output.seek(0)
        text = output.read()
    largest = usage.ru_maxrss / 1024
    cpu = usage.ru_utime + usage.ru_stime
    step = Step(name, proc.returncode, wall, cpu, max(peak[0] / 2**20, largest), largest, text)
    state = "ok" if step.returncode == 0 else f"FAILED (exit {step.returncode})"
    print(f"  {name}: {state}, {wall:.1f} s ({cpu:.1f} s CPU), peak {step.peak_mb:,.0f} MB", flush=True)
    if step.returncode != 0:
        print("    " + "\n    ".join(text.strip().splitlines()[-8:]), flush=True)
    return step


def maskstream(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "maskstream", *arguments]


def pipeline_steps(corpus: Corpus, work: Path, encoded: int, timeout_s: float) -> tuple[dict[str, Step], int, int]:
    """stats, seeds, build and the two dry runs on `corpus`; also returns (min word count, encoded types)."""
    stats, seeds, dataset = work / "stats", work / "seeds" / "seeds.json", work / "dataset"
    min_count, encoded_types = min_word_count_for(corpus.counts, encoded)
    steps = {}
    steps["stats"] = run_measured("stats", maskstream("stats", "--input", corpus.pattern, "--output", str(stats)),
                                  timeout_s)
    steps["seeds"] = run_measured("seeds", maskstream("seeds", "--stats", str(stats), "--output", str(seeds)),
                                  timeout_s)
    build = ["--input", corpus.pattern, "--stats", str(stats), "--seeds", str(seeds), "--model", default_model(),
             "--min-word-count", str(min_count), "--encoder-dtype", "float32"]
    steps["build"] = run_measured("build", maskstream("build", *build, "--output", str(dataset)), timeout_s)
    steps["stats dry run"] = run_measured("stats dry run", maskstream(
        "stats", "--input", corpus.pattern, "--output", f"{REMOTE_OUTPUT}/stats", *DATAFLOW_DRY_RUN), timeout_s)
    steps["build dry run"] = run_measured("build dry run", maskstream(
        "build", *build, "--output", f"{REMOTE_OUTPUT}/datasets", *DATAFLOW_DRY_RUN), timeout_s)
    return steps, min_count, encoded_types


# ---------------------------------------------------------------------------------------------
# Reports


def _megabytes(step: Step) -> str:
    return f"{step.peak_mb:,.0f}" if step.returncode == 0 else "failed"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def _job(step: Step) -> str:
    job = step.job()
    return f"{job[0]:,} B, {job[1]} transforms" if job else "n/a"


def corpus_report(big: Corpus, tiny: Corpus, steps: dict[str, Step], baseline: dict[str, Step],
                  generate_s: float) -> str:
    types = big.word_types - tiny.word_types
    lines = [
        f"corpus: {big.word_types:,} word types, {big.words:,} words, {big.documents:,} documents in {big.files} "
        f"JSONL files, written in {generate_s:.1f} s; baseline corpus: {tiny.word_types:,} types, {tiny.words:,} words",
        "",
        "| step | wall s | CPU s | peak RSS MB (tree) | largest process MB | baseline peak MB | bytes per word type "
        "| job size |",
        "|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for name, step in steps.items():
        base = baseline[name]
        per_type = (f"{round((step.peak_mb - base.peak_mb) * 2**20 / types):,}"
                    if step.returncode == 0 and base.returncode == 0 else "n/a")
        lines.append(f"| {name} | {step.wall_s:.1f} | {step.cpu_s:.1f} | {_megabytes(step)} | {step.largest_process_mb:,.0f} | "
                     f"{_megabytes(base)} | {per_type} | {_job(step)} |")
    before = BEFORE_ISSUE_28
    lines += ["", "Before issue 28 (build dry run on the shipped corpus, 1,000 encoded words; main's code):",
              "", "| word types | job bytes | launcher peak MB | launcher wall s |", "|--:|--:|--:|--:|"]
    lines += [f"| {size:,} | {row['job_bytes']:,} | {row['launcher_peak_mb']:,} | {row['launcher_wall_s']} |"
              for size, row in before.items()]
    dry = steps["build dry run"].job()
    closest = min(before, key=lambda size: abs(size - big.word_types))
    if dry:
        lines += ["", f"build dry run here: {dry[0]:,} bytes for {big.word_types:,} types; before: "
                      f"{before[closest]['job_bytes']:,} bytes for {closest:,} types "
                      f"({dry[0] / before[closest]['job_bytes']:.3f}x)"]
    return "\n".join(lines)


def job_size_sweep(sizes: list[int], work: Path, timeout_s: float) -> str:
    rows = []
    for size in sizes:
        print(f"{size:,} word types: writing word stats", flush=True)
        stats, seeds = work / f"stats-{size}", work / f"seeds-{size}" / "seeds.json"
        started = time.perf_counter()
        tf = write_word_stats(stats, size)
        print(f"  written in {time.perf_counter() - started:.1f} s", flush=True)
        seeding = run_measured("seeds", maskstream("seeds", "--stats", str(stats), "--output", str(seeds)), timeout_s)
        min_count, encoded_types = min_word_count_for(tf, BEFORE_ENCODED)
        dry = run_measured("build dry run", maskstream(
            "build", "--input", str(SAMPLE), "--stats", str(stats), "--seeds", str(seeds), "--model", default_model(),
            "--min-word-count", str(min_count), "--encoder-dtype", "float32",
            "--output", f"{REMOTE_OUTPUT}/datasets", *DATAFLOW_DRY_RUN), timeout_s)
        rows.append((size, encoded_types, seeding, dry))
    lines = ["| word types | encoded | seeds wall s | seeds peak MB | job bytes | transforms | before: job bytes | "
             "ratio | launcher peak MB (tree) | largest process MB | before | launcher wall s | CPU s | before |",
             "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for size, encoded_types, seeding, dry in rows:
        before = BEFORE_ISSUE_28.get(size, {})
        job = dry.job()
        ratio = f"{job[0] / before['job_bytes']:.3f}x" if job and before else "n/a"
        lines.append(
            f"| {size:,} | {encoded_types:,} | {seeding.wall_s:.1f} | {_megabytes(seeding)} | "
            f"{f'{job[0]:,}' if job else 'n/a'} | {job[1] if job else 'n/a'} | "
            f"{_number(before.get('job_bytes'))} | {ratio} | {_megabytes(dry)} | {dry.largest_process_mb:,.0f} | "
            f"{_number(before.get('launcher_peak_mb'))} | {dry.wall_s:.1f} | {dry.cpu_s:.1f} | "
            f"{before.get('launcher_wall_s', 'n/a')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--word-types", type=int, default=2_000_000, help="distinct words of the corpus (default: %(default)s)")
    parser.add_argument("--words", type=int, default=None,
                        help="words of the corpus (default: 3 x --word-types; the Zipf head is scaled to it)")
    parser.add_argument("--baseline-word-types", type=int, default=1_000,
                        help="word types of the baseline corpus (default: %(default)s)")
    parser.add_argument("--encoded", type=int, default=2_000,
                        help="about how many word types the build encodes (default: %(default)s)")
    parser.add_argument("--shards", type=int, default=8, help="JSONL files of the corpus (default: %(default)s)")
    parser.add_argument("--job-sizes", default=None, metavar="N,N,...",
                        help="instead: the build's dry-run job for stats of these many word types")
    parser.add_argument("--work-dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--step-timeout", type=float, default=3600, help="seconds before a step is killed (default: %(default)s)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="vocabulary-scale-", dir=args.work_dir) as folder:
        work = Path(folder)
        if args.job_sizes:
            sizes = [int(size) for size in args.job_sizes.split(",")]
            print(job_size_sweep(sizes, work, args.step_timeout))
            return 0
        corpora, steps = {}, {}
        for label, word_types in (("baseline", args.baseline_word_types), ("large", args.word_types)):
            # At least 50,000 words: enough documents for the seeds' df filter on the baseline.
            total = args.words if label == "large" and args.words else max(3 * word_types, 50_000)
            print(f"{label}: writing a corpus of {word_types:,} word types, {total:,} words", flush=True)
            started = time.perf_counter()
            corpora[label] = write_zipf_corpus(work / label / "corpus", word_types, total, shards=args.shards)
            generate_s = time.perf_counter() - started
            print(f"  {corpora[label].documents:,} documents in {generate_s:.1f} s", flush=True)
            steps[label], min_count, encoded_types = pipeline_steps(corpora[label], work / label, args.encoded,
                                                                    args.step_timeout)
            print(f"  (build: --min-word-count {min_count}, {encoded_types:,} types encoded)", flush=True)
        print()
        print(corpus_report(corpora["large"], corpora["baseline"], steps["large"], steps["baseline"], generate_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())

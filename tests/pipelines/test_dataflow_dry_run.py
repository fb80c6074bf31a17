"""Dataflow dry runs from the command line (issue 28 item 2): `maskstream stats` and `maskstream build`
with `--runner=DataflowRunner --no_auth --dry_run=True` build the job offline, print its size, write
nothing and exit 0; the job stays the same size from 1,000 to 1,000,000 word types (synthetic Zipf
corpora and their word statistics, benchmarks/vocabulary_scale.py), and so does the build with
`--peer-signals` (issue 52: the n-gram and pair counts are PCollections, not graph data)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORD_TYPES = (1_000, 1_000_000)
DATAFLOW_DRY_RUN = ["--runner=DataflowRunner", "--project", "my-project-123", "--region", "us-central1",
                    "--temp_location", "gs://mask-bucket/tmp", "--no_auth", "--dry_run=True"]
JOB_LINE = re.compile(r"dry run: Dataflow job of ([\d,]+) bytes .*?, (\d+) transforms")
MAX_JOB_BYTES = 1_000_000

pytestmark = pytest.mark.slow  # nine dry runs, each its own process


def vocabulary_scale():
    spec = importlib.util.spec_from_file_location("vocabulary_scale", REPO / "benchmarks" / "vocabulary_scale.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def offline_env(subprocess_env: dict[str, str]) -> dict[str, str]:
    """Any Cloud Storage request goes to a closed local port and fails at once: a dry run must make none."""
    return {**subprocess_env, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}


def maskstream(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "maskstream", *arguments], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `root`: its size and modification time."""
    listing = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(folder, name)
            stat = path.stat()
            listing[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return listing


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str]) -> dict[int, dict[str, str]]:
    """Per vocabulary size: a synthetic Zipf corpus (4 JSONL files, every type at least once), a word
    statistics folder of the same words (`maskstream stats`'s format) and `maskstream seeds` of it.

    The statistics are written directly (vocabulary_scale.write_word_stats, as the benchmark's --job-sizes
    sweep does) rather than by `maskstream stats` (90 s of CPU at a million types): a dry run reads no
    word of them (pipelines/dataset/driver.py), and a job that did would carry the million words all the same."""
    bench = vocabulary_scale()
    made = {}
    for word_types in WORD_TYPES:
        root = tmp_path_factory.mktemp(f"types-{word_types}")
        corpus = bench.write_zipf_corpus(root / "corpus", word_types, word_types + 50_000, shards=4)
        assert len(corpus.counts) == word_types and corpus.counts.min() >= 1  # the vocabulary really is that large
        stats, seeds = root / "stats", root / "seeds" / "seeds.json"
        bench.write_word_stats(stats, word_types)
        result = maskstream(subprocess_env, "seeds", "--stats", str(stats), "--output", str(seeds))
        assert result.returncode == 0, result.stderr[-3000:]
        min_count, _ = bench.min_word_count_for(corpus.counts, 1_000)
        made[word_types] = {"root": str(root), "input": corpus.pattern, "stats": str(stats), "seeds": str(seeds),
                            "min_word_count": str(min_count)}
    return made


def dry_run(env: dict[str, str], command: str, corpus: dict[str, str], output: str,
            minilm_path: str) -> tuple[int, int, str]:
    """(job bytes, transforms, the command's output) of a dry run; asserts it exited 0."""
    if command == "stats":
        arguments = ["stats", "--input", corpus["input"]]
    else:
        arguments = ["build", "--input", corpus["input"], "--stats", corpus["stats"], "--seeds", corpus["seeds"],
                     "--model", minilm_path, "--min-word-count", corpus["min_word_count"],
                     "--encoder-dtype", "float32", *command.split()[1:]]
    result = maskstream(env, *arguments, "--output", output, *DATAFLOW_DRY_RUN)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-3000:]
    match = JOB_LINE.search(text)
    assert match, f"no job-size line in the output of `maskstream {command}`:\n{text[-3000:]}"
    return int(match.group(1).replace(",", "")), int(match.group(2)), text


@pytest.mark.parametrize("command", ["stats", "build", "build --peer-signals"])
def test_dry_run_job_is_small_flat_in_the_vocabulary_and_writes_nothing(
        command: str, corpora: dict[int, dict[str, str]], subprocess_env: dict[str, str], minilm_path: str) -> None:
    env = offline_env(subprocess_env)
    jobs = {}
    for word_types, corpus in corpora.items():
        root = Path(corpus["root"])
        before = tree(root)
        job_bytes, transforms, text = dry_run(env, command, corpus, f"gs://mask-bucket/{command.split()[0]}",
                                              minilm_path)
        assert tree(root) == before  # no fingerprint, no seeds copy, the stats and the corpus untouched
        assert "not checked" in text  # it says that the remote paths were not checked
        jobs[word_types] = job_bytes
        assert job_bytes <= MAX_JOB_BYTES, f"{word_types:,} word types: a job of {job_bytes:,} bytes"
        assert transforms > 0
    print(f"maskstream {command}: Dataflow job bytes by word types {jobs}")
    small, large = jobs[WORD_TYPES[0]], jobs[WORD_TYPES[-1]]
    assert abs(large - small) <= 0.05 * small, f"job bytes {jobs} grow with the vocabulary"

    # With a local --output the dry run still creates nothing there: no version folder, no staging folder.
    corpus = corpora[WORD_TYPES[-1]]
    root = Path(corpus["root"])
    before = tree(root)
    output = root / f"{command.replace(' --', '-')}-output"
    dry_run(env, command, corpus, str(output), minilm_path)
    assert tree(root) == before, sorted(set(tree(root)) - set(before))

"""Where an update's changed files should be counted and tokenized: in its own process, or by Beam.

    python -m benchmarks.small_update [--corpus DEBIAN.jsonl] [--sizes 1 4 16 32] [--workers 2]

`maskstream update` counts and tokenizes the files that changed (pipelines/update/incremental.py).
For each size of changed text (MB of JSONL, Debian descriptions split into 4 files), this times the
same work three ways, each writing the same cache entries:

1. in the update's own process (`parse_file` + `count_and_tokenize_file`, what small changes use);
2. a Beam pipeline on the DirectRunner, one worker (`ProcessFiles`, what large changes used to use);
3. the same pipeline with --workers worker processes (`--direct_running_mode=multi_processing`).

Prints one table with the seconds of each and Beam's time over the in-process time, then the
linear fit (seconds = start + per MB x MB) of each and the size where the multi-worker pipeline
catches up with one process: changed_files.IN_PROCESS_MAX_BYTES (pipelines/update/) is set from it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.debian_corpus import corpus_or_made


def changed_files(lines: list[str], megabytes: float, folder: Path, files: int = 4) -> dict[str, str]:
    """Writes about `megabytes` MB of `lines` as `files` JSONL files; returns {path: cache key}."""
    folder.mkdir(parents=True)
    chosen, size = [], 0
    for line in lines:
        if size >= megabytes * 1e6:
            break
        chosen.append(line)
        size += len(line.encode("utf-8")) + 1
    per_file = -(-len(chosen) // files)
    keys = {}
    for i in range(files):
        path = folder / f"part-{i}.jsonl"
        path.write_text("\n".join(chosen[i * per_file : (i + 1) * per_file]) + "\n", encoding="utf-8")
        keys[str(path)] = f"key-{i}"
    return keys


def in_process(keys: dict[str, str], cache: str, tokenizer_name: str) -> float:
    from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer
    from maskstream.pipelines.update.cache import count_and_tokenize_file, parse_file

    started = time.perf_counter()
    tokenizer = load_backend_tokenizer(tokenizer_name)
    for path, key in sorted(keys.items()):
        documents, rejects = parse_file(path, "text", "line")
        count_and_tokenize_file(path, key, documents, rejects, cache, tokenizer, 256)
    return time.perf_counter() - started


def with_beam(keys: dict[str, str], cache: str, tokenizer_name: str, workers: int) -> float:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from maskstream.pipelines.update.process_files import ProcessFiles

    args = [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"] if workers > 1 else []
    started = time.perf_counter()
    pipeline = beam.Pipeline(options=PipelineOptions(args))
    _ = pipeline | "ProcessFiles" >> ProcessFiles(keys, cache, tokenizer_name, "text", "line", 256)
    pipeline.run().wait_until_finish()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=None, help="Debian JSONL corpus (default: made with debian_corpus.py)")
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 32], help="MB of changed text")
    parser.add_argument("--workers", type=int, default=2, help="Beam worker processes of the third way")
    args = parser.parse_args()

    import logging

    from maskstream.models import default_model
    from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer

    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="maskstream-small-update-"))
    lines = corpus_or_made(args.corpus, work).read_text(encoding="utf-8").splitlines()
    model = default_model()
    load_backend_tokenizer(model)  # both ways find it loaded: the process and Beam's in-memory worker
    rows = []
    for size in args.sizes:
        keys = changed_files(lines, size, work / f"corpus-{size:g}")
        measured = {}
        for name, workers in (("in process", 0), ("Beam, 1 worker", 1), (f"Beam, {args.workers} workers", args.workers)):
            cache = str(work / "cache")
            measured[name] = in_process(keys, cache, model) if workers == 0 else with_beam(keys, cache, model, workers)
            shutil.rmtree(cache)
        rows.append((size, measured))
        print(f"{size:g} MB: " + ", ".join(f"{k} {v:.2f} s" for k, v in measured.items()), flush=True)

    names = list(rows[0][1])
    print()
    print("| changed MB | " + " | ".join(f"{n} s" for n in names) + " | " + " | ".join(f"{n} / in process" for n in names[1:]) + " |")
    print("|---:|" + "---:|" * (2 * len(names) - 1))
    for size, measured in rows:
        base = measured[names[0]]
        print(f"| {size:g} | " + " | ".join(f"{measured[n]:.2f}" for n in names) + " | "
              + " | ".join(f"{measured[n] / base:.2f}" for n in names[1:]) + " |")
    sizes = np.array([size for size, _ in rows])
    fits = {n: np.polyfit(sizes, [m[n] for _, m in rows], 1) for n in names}  # (per MB, start)
    print()
    for n, (per_mb, start) in fits.items():
        print(f"{n}: {start:.2f} s + {per_mb:.3f} s/MB")
    (in_mb, in_start), (beam_mb, beam_start) = fits[names[0]], fits[names[-1]]
    if beam_mb < in_mb:
        print(f"the {names[-1]} pipeline catches up with one process at "
              f"{(beam_start - in_start) / (in_mb - beam_mb):.1f} MB of changed text")
    else:
        print(f"the {names[-1]} pipeline never catches up with one process on this machine")
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

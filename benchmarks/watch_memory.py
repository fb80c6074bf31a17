"""What `maskstream watch` keeps from one rebuild to the next, measured by version (issue 42).

    python -m benchmarks.watch_memory [--versions 200] [--compare 20] [--work DIR]

Runs the watch's own loop (`Watcher.check`, in this process, as `maskstream watch` does) over a corpus
that changes before every check (benchmarks/soak.py's CorpusChanger: 4 JSONL files of 10 shipped
descriptions and one malformed line, one file rewritten each time), with `maskstream gc --keep 2` every 10 versions.
After every published version it records this process's Python heap (tracemalloc), its RSS, the
encoder process's RSS and pyarrow's memory pool (`pa.total_allocated_bytes()`). Prints them at a few
versions, and the 15 allocation sites whose size grew most between version --compare and the last
(tracemalloc snapshots, diffed by file and line).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import logging
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa

from benchmarks.soak import CorpusChanger
from maskstream.cli import build_parser
from maskstream.cli.update import update_options
from maskstream.pipelines.update.watch import EXIT_BUILT, Watcher

GC_EVERY = 10  # versions between two `maskstream gc --keep 2` runs
WATCH_FLAGS = ["--max-length", "64", "--shard-rows", "16", "--row-group-rows", "8"]  # benchmarks/soak.py's


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_in_use() -> dict[str, float]:
    """glibc's mallinfo2: bytes in use (C, C++ and Rust libraries, Python's objects over 512 bytes) and
    free in its arenas, and in mmapped blocks; {} where the C library is not glibc 2.33+."""
    try:
        mallinfo2 = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    except (OSError, AttributeError, TypeError):
        return {}
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return {"malloc_used_mb": (info.uordblks + info.hblkhd) / 2**20, "malloc_free_mb": info.fordblks / 2**20}


def memory_figures() -> dict[str, float]:
    process = psutil.Process()
    children = process.children(recursive=True)
    return {"heap_mb": tracemalloc.get_traced_memory()[0] / 2**20,
            "rss_mb": process.memory_info().rss / 2**20,
            "encoder_rss_mb": sum(c.memory_info().rss for c in children) / 2**20,
            "arrow_mb": pa.total_allocated_bytes() / 2**20,
            **malloc_in_use()}


def watch_versions(work: Path, versions: int, compare: int, keep: int = 2, model: str | None = None) -> dict[str, Any]:
    """Publishes `versions` versions through one Watcher; returns the figures by version and the
    heap's growth between version `compare` and the last, by allocation site. `model`: the watch's
    --model (default: its default, the offline MiniLM)."""
    changer = CorpusChanger(work / "corpus", files=4, docs_per_file=10)
    root = work / "dataset"
    flags = [*WATCH_FLAGS, *(["--model", model] if model else [])]
    args = build_parser().parse_args(["watch", str(changer.folder), "--output", str(root), *flags])
    watcher = Watcher(str(changer.folder), update_options(args, [], str(root)), interval=0.05, settle=0)
    tracemalloc.start(1)  # the report groups by the innermost frame ("lineno"): deeper stacks only cost time
    # What lives before the first version (torch, transformers, Beam, the caller's) is frozen: the collections
    # below walk only what the watch made since, not millions of objects each time (about a second each).
    # A frozen object that became garbage would stay: growth can be overstated, never hidden.
    gc.collect()
    gc.freeze()
    by_version, first, started = [], None, time.perf_counter()
    while len(by_version) < versions:
        changer.write(changer.changes % changer.files)
        if watcher.check() != EXIT_BUILT:
            continue
        if len(by_version) % GC_EVERY == GC_EVERY - 1:  # in a process of its own, as beside a real watch
            subprocess.run([sys.executable, "-m", "maskstream", "gc", str(root), "--keep", str(keep),
                            "--grace-minutes", "0"], check=True, capture_output=True)
        gc.collect()  # the heap of live objects, not of garbage the collector has yet to reach
        by_version.append({"version": len(by_version) + 1, **memory_figures()})
        if len(by_version) == compare:
            first = tracemalloc.take_snapshot()
    gc.collect()
    last = tracemalloc.take_snapshot()
    grew = [] if first is None else [
        {"site": f"{stat.traceback[0].filename.split('site-packages/')[-1]}:{stat.traceback[0].lineno}",
         "kb": stat.size_diff / 1024, "blocks": stat.count_diff}
        for stat in last.compare_to(first, "lineno")[:15]]
    tracemalloc.stop()
    gc.unfreeze()
    return {"versions": by_version, "grew": grew, "seconds": time.perf_counter() - started}


def report(figures: dict[str, Any], compare: int) -> str:
    rows = figures["versions"]
    marks = sorted({1, compare, *(v for v in (50, 100, 250, 500) if v <= len(rows)), len(rows)})
    lines = ["| version | Python heap MB | malloc in use MB | malloc free MB | pyarrow pool MB | watch RSS MB "
             "| encoder RSS MB |", "|--:|--:|--:|--:|--:|--:|--:|"]
    for v in marks:
        row = rows[v - 1]
        lines.append(f"| {v} | {row['heap_mb']:.1f} "
                     f"| {row.get('malloc_used_mb', float('nan')):.1f} | {row.get('malloc_free_mb', float('nan')):.1f} "
                     f"| {row['arrow_mb']:.1f} | {row['rss_mb']:.0f} | {row['encoder_rss_mb']:.0f} |")
    if len(rows) > compare:
        a, b = rows[compare - 1], rows[-1]
        per = len(rows) - compare
        lines.append(f"\nfrom version {compare} to {len(rows)}: heap {b['heap_mb'] - a['heap_mb']:+.2f} MB "
                     f"({(b['heap_mb'] - a['heap_mb']) * 1024 / per:+.1f} kB a version), watch RSS "
                     f"{b['rss_mb'] - a['rss_mb']:+.0f} MB, encoder RSS {b['encoder_rss_mb'] - a['encoder_rss_mb']:+.0f} MB")
    lines.append(f"{len(rows)} versions in {figures['seconds']:.0f} s")
    lines += ["\nheap growth by allocation site (tracemalloc):"]
    lines += [f"  {g['kb']:+9.1f} kB {g['blocks']:+7d} blocks  {g['site']}" for g in figures["grew"]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=200, help="versions to publish (default: 200)")
    parser.add_argument("--compare", type=int, default=20, help="the version whose heap is compared (default: 20)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as scratch:
        figures = watch_versions(args.work or Path(scratch), args.versions, args.compare)
    print(report(figures, args.compare))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

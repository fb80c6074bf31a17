"""Soak: `watch`, `gc` and a following `train` running together while the corpus keeps changing.

    python -m benchmarks.soak [--minutes 10] [--work DIR]

What runs at once, for --minutes (bounded in time, and in count by --max-versions and --max-steps):

- a script (a thread here) rewrites one of the corpus's --files JSONL files every --change-every
  seconds with another slice of the shipped descriptions and one malformed line (so every version
  has rejects), each file written aside and renamed into place;
- `maskstream watch CORPUS --output ROOT --interval 1 --settle 1` publishes a version per change;
- `maskstream gc ROOT --keep 2 --grace-minutes 0.05` (3 s) every --gc-every seconds;
- `maskstream train --dataset ROOT --follow-latest` with small epochs (a version holds a few dozen
  sequences), a 2-layer 32-wide BERT with MiniLM's vocabulary (as tests/conftest.py's `tiny_bert`),
  so it switches to a newer version every few epochs.
Before the clock starts: the first version is built and the trainer takes its first step.

Passing: 0 read errors in the trainer (no error, traceback or failed read in its log), every
version published has documents read = accepted (written) + rejected = the records the script
wrote into the files of its fingerprint, the trainer ends on the newest version (the watch stops
first, the trainer is stopped once it follows the last version), and the RSS of the trainer and
of watch (each with its child processes) stays flat: the median of the last minute is within
+15 % (or +50 MB, whichever is more) of the median of the first minute after each process is
ready. Prints the figures: versions published and collected, switches, steps, errors, RSS; exit
status 0 when passing. `run_soak()` returns them (tests/test_soak.py runs it for 60 s).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "debian-science.jsonl"
# A record no reader must fail on (issue 31): one per file, so every version has rejects.
MALFORMED = [b"{not json", b"[" * 5000 + b"]" * 5000, b'{"text": 5}', b'{"body": "no text field"}']
ERROR_PATTERN = re.compile(r"Traceback|\bERROR\b|Error:|cannot read|could not read", re.IGNORECASE)
SWITCH_PATTERN = re.compile(r"switching from dataset version (\S+) to (\S+) ")


def tiny_bert(path: Path) -> str:
    """A 2-layer, 32-wide BERT with MiniLM's vocabulary and tokenizer (tests/conftest.py's tiny_bert)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from schemas.models import default_model

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertForMaskedLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(default_model()).save_pretrained(path)
    return str(path)


class CorpusChanger:
    """Writes the corpus files and rewrites one every `every` seconds; remembers how many records
    each content it wrote holds (by sha256), which is what a version's fingerprint names."""

    def __init__(self, folder: Path, files: int, docs_per_file: int):
        self.folder, self.files, self.docs = folder, files, docs_per_file
        self.lines = SAMPLE.read_bytes().splitlines()
        self.records: dict[str, int] = {}
        self.changes = 0
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(files):
            self.write(index)

    def write(self, index: int) -> None:
        start = (self.changes * self.docs + index * 97) % (len(self.lines) - self.docs)
        body = self.lines[start:start + self.docs] + [MALFORMED[self.changes % len(MALFORMED)]]
        content = b"\n".join(body) + b"\n"
        self.records[hashlib.sha256(content).hexdigest()] = len(body)
        temporary = self.folder / f".part-{index}.tmp"
        temporary.write_bytes(content)
        os.replace(temporary, self.folder / f"part-{index}.jsonl")
        self.changes += 1

    def run(self, every: float, stop: threading.Event) -> None:
        while not stop.wait(every):
            self.write(self.changes % self.files)


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its children (DataLoader workers, Beam's)."""
    import psutil

    try:
        process = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
    except psutil.Error:
        return 0


def flat(samples: list[tuple[float, int]], ready: float, end: float, window: float) -> dict[str, Any]:
    """Median RSS of the first window after `ready` and of the last window; flat within +15 % and 50 MB."""
    first = [rss for t, rss in samples if ready <= t <= ready + window and rss]
    last = [rss for t, rss in samples if end - window <= t <= end and rss]
    if not first or not last:
        return {"first_mb": None, "last_mb": None, "ratio": None, "flat": False}
    a, b = statistics.median(first), statistics.median(last)
    return {"first_mb": a / 2**20, "last_mb": b / 2**20, "ratio": b / a, "flat": b <= max(1.15 * a, a + 50 * 2**20)}


def run_soak(work: Path, minutes: float = 10.0, files: int = 4, docs_per_file: int = 10, change_every: float = 4.0,
             gc_every: float = 3.0, max_versions: int = 500, max_steps: int = 1_000_000,
             setup_timeout: float = 600.0) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    cli = [sys.executable, "-m", "maskstream"]
    corpus, root, out = work / "corpus", work / "dataset", work / "train"
    model = tiny_bert(work / "tiny-bert")
    changer = CorpusChanger(corpus, files, docs_per_file)
    logs = {name: open(work / f"{name}.log", "w") for name in ("watch", "train", "gc")}  # noqa: SIM115
    stop = threading.Event()
    seen: dict[str, dict[str, Any]] = {}  # version -> its manifest's document counts and fingerprint check
    rss: dict[str, list[tuple[float, int]]] = {"train": [], "watch": []}
    figures: dict[str, Any] = {"gc_runs": 0, "gc_failures": 0, "versions_collected": 0}

    watch = subprocess.Popen([*cli, "watch", str(corpus), "--output", str(root), "--interval", "1", "--settle", "1",
                              "--max-length", "64", "--shard-rows", "16", "--row-group-rows", "8"],
                             env=env, stdout=logs["watch"], stderr=subprocess.STDOUT)
    processes = {"watch": watch}

    def read_latest() -> None:
        """The version `latest` names, read as soon as it is published (gc may take it later)."""
        from schemas.manifest import load_manifest

        try:
            _, manifest = load_manifest(str(root))
        except Exception:  # noqa: BLE001 - no version yet, or the pointer is being replaced
            return
        if manifest.version in seen:
            return
        documents = manifest.source_fingerprint.get("documents", {})
        written = sum(changer.records.get(f["sha256"], -10**9) for f in manifest.source_fingerprint["files"])
        seen[manifest.version] = {**documents, "records_written": written, "ok": documents.get("read") == written
                                  == documents.get("accepted", -1) + documents.get("rejected", -1)}

    def read_versions() -> None:
        while not stop.wait(0.3):
            read_latest()

    def sample_rss() -> None:
        while not stop.wait(2.0):
            for name, process in list(processes.items()):  # a copy: the main thread adds processes
                if process.poll() is None:
                    rss[name].append((time.monotonic(), tree_rss(process.pid)))

    def collect() -> None:
        while not stop.wait(gc_every):
            result = subprocess.run([*cli, "gc", str(root), "--keep", "2", "--grace-minutes", "0.05"], env=env,
                                    capture_output=True, text=True)
            logs["gc"].write(result.stdout + result.stderr)
            figures["gc_runs"] += 1
            if result.returncode != 0:
                figures["gc_failures"] += 1
                continue
            figures["versions_collected"] += json.loads(result.stdout.strip().splitlines()[-1])["versions"]

    threads = [threading.Thread(target=f, daemon=True) for f in (read_versions, sample_rss)]
    for thread in threads:
        thread.start()
    ready: dict[str, float] = {}
    try:
        deadline = time.monotonic() + setup_timeout
        while not seen:  # the first version, then the trainer's first step
            if watch.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"watch published no version (see {work / 'watch.log'})")
            time.sleep(0.5)
        ready["watch"] = time.monotonic()
        train = subprocess.Popen(
            [*cli, "train", "--dataset", str(root), "--follow-latest", "--output", str(out), "--model", model,
             "--batch-size", "8", "--max-steps", str(max_steps), "--num-workers", "1", "--eval-samples", "4",
             "--eval-every", str(max_steps), "--save-every", str(max_steps), "--log-every", "1"],
            env=env, stdout=logs["train"], stderr=subprocess.STDOUT)
        processes["train"] = train
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and '"split": "train"' in metrics.read_text()):
            if train.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the trainer took no step (see {work / 'train.log'})")
            time.sleep(0.5)
        ready["train"] = time.monotonic()

        # The soak itself.
        started = time.monotonic()
        for target in (lambda: changer.run(change_every, stop), collect):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            threads.append(thread)
        while time.monotonic() - started < minutes * 60 and len(seen) < max_versions:
            if watch.poll() is not None or train.poll() is not None:
                break
            time.sleep(1.0)
        ended = time.monotonic()
        figures["minutes"] = (ended - started) / 60
        stop.set()
        # Stop watch (it finishes a build in progress), then let the trainer follow the last version.
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=600)
        read_latest()  # a version published while watch stopped
        from schemas.manifest import load_manifest

        newest = load_manifest(str(root))[1].version
        deadline = time.monotonic() + 300
        while current_version(work / "train.log") != newest and train.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
        figures["trainer_on"] = current_version(work / "train.log")
        figures["newest"] = newest
        figures["trainer_exit_before_stop"] = train.poll()
        train_log = (work / "train.log").read_text(errors="replace")  # before it is stopped: a kill is no error
    finally:
        stop.set()
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=60)
        for thread in threads:
            thread.join(timeout=120)
        for log in logs.values():
            log.close()

    errors = [line for line in train_log.splitlines() if ERROR_PATTERN.search(line)]
    window = min(60.0, figures["minutes"] * 60 / 4)
    steps = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"]
    figures.update({
        "versions_published": len(seen),
        "versions_accounted": sum(v["ok"] for v in seen.values()),
        "documents": {"read": sum(v.get("read", 0) for v in seen.values()),
                      "accepted": sum(v.get("accepted", 0) for v in seen.values()),
                      "rejected": sum(v.get("rejected", 0) for v in seen.values())},
        "corpus_changes": changer.changes - files,
        "switches": len(SWITCH_PATTERN.findall(train_log)),
        "steps": max(steps, default=0),
        "trainer_read_errors": len(errors),
        "error_lines": errors[:5],
        "watch_build_failures": (work / "watch.log").read_text(errors="replace").count("build failed"),
        "rss_window_s": window,
        "rss": {name: flat(rss[name], ready.get(name, 0.0), ended, window) for name in rss},
    })
    figures["passed"] = (figures["trainer_read_errors"] == 0 and figures["gc_failures"] == 0
                         and figures["watch_build_failures"] == 0 and figures["trainer_exit_before_stop"] is None
                         and figures["versions_accounted"] == figures["versions_published"] >= 2
                         and figures["trainer_on"] == figures["newest"]
                         and all(r["flat"] for r in figures["rss"].values()))
    return figures


def current_version(train_log: Path) -> str | None:
    """The version the trainer streams: the last it switched to, else the one it started on."""
    text = train_log.read_text(errors="replace") if train_log.exists() else ""
    switches = SWITCH_PATTERN.findall(text)
    if switches:
        return switches[-1][1]
    started = re.search(r"training \S+ on (\S+):", text)
    return started.group(1).rstrip("/").rsplit("/", 1)[1] if started else None


def report(figures: dict[str, Any]) -> str:
    rss = "; ".join(f"{name} {r['first_mb'] or 0:.0f} MB -> {r['last_mb'] or 0:.0f} MB (x{r['ratio'] or 0:.3f}, "
                    f"{'flat' if r['flat'] else 'GROWING'})" for name, r in figures["rss"].items())
    docs = figures["documents"]
    return "\n".join([
        f"soak of {figures['minutes']:.1f} min: {'PASSED' if figures['passed'] else 'FAILED'}",
        f"  corpus changes {figures['corpus_changes']}, versions published {figures['versions_published']}, "
        f"collected by gc {figures['versions_collected']} ({figures['gc_runs']} runs, {figures['gc_failures']} failed)",
        f"  documents over all versions: read {docs['read']} = accepted {docs['accepted']} + rejected "
        f"{docs['rejected']}; versions with read = written + rejected = the records written: "
        f"{figures['versions_accounted']} of {figures['versions_published']}",
        f"  trainer: {figures['steps']} steps, {figures['switches']} switches, {figures['trainer_read_errors']} read "
        f"errors, ends on {figures['trainer_on']} (newest {figures['newest']})",
        f"  watch build failures {figures['watch_build_failures']}",
        f"  RSS, median of the first vs the last {figures['rss_window_s']:.0f} s: {rss}",
        *[f"  error: {line}" for line in figures["error_lines"]],
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the soak (default: 10)")
    parser.add_argument("--work", default=None, help="working folder (default: a new temporary one)")
    parser.add_argument("--change-every", type=float, default=4.0, help="seconds between corpus changes (default: 4)")
    parser.add_argument("--gc-every", type=float, default=3.0, help="seconds between gc runs (default: 3)")
    parser.add_argument("--max-versions", type=int, default=500, help="stop after this many versions (default: 500)")
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="maskstream-soak-"))
    figures = run_soak(work, args.minutes, change_every=args.change_every, gc_every=args.gc_every,
                       max_versions=args.max_versions)
    print(report(figures))
    print(f"logs in {work}")
    return 0 if figures["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Soak: `watch`, `gc` and a following `train` running together while the corpus keeps changing.

    python -m benchmarks.soak [--versions 100] [--work DIR]

What runs at once, until --versions versions are published, however long the machine's load makes
that take:

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
of watch (each with its child processes) stays flat: the median over the last RSS_VERSIONS versions
is within +15 % (or +50 MB, whichever is more) of the median over the RSS_VERSIONS versions after
the warm-up (version 20, or a third of --versions when that is less). Prints the figures: versions published and collected, switches, steps, errors, RSS; exit
status 0 when passing. `run_soak()` returns them (tests/test_soak.py runs it for 30 versions).
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
RSS_VERSIONS = 10  # versions in each of the two windows the RSS verdict compares
RSS_MARKS = (20, 100, 250, 500)  # versions whose RSS the report gives (docs/updates.md's table)
WARM_UP_VERSIONS = 20
SECONDS_PER_VERSION_AT_MOST = 120  # a soak that publishes slower than this has hung: it stops and fails
SWITCH_PATTERN = re.compile(r"switching from dataset version (\S+) to (\S+) ")


def tiny_bert(path: Path) -> str:
    """A 2-layer, 32-wide BERT with MiniLM's vocabulary and tokenizer (tests/conftest.py's tiny_bert)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from maskstream.models import default_model

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


def between(samples: list[tuple[float, int]], start: float, end: float) -> list[int]:
    """The RSS samples taken from `start` to `end` (a sample of 0: the process was gone)."""
    return [rss for t, rss in samples if start <= t <= end and rss]


def rss_at(samples: list[tuple[float, int]], start: float, end: float) -> float | None:
    """Median RSS (MB) sampled between two times (a version's publication and the next's), or the
    nearest sample before the end when none falls between."""
    inside = between(samples, start, end)
    before = [rss for t, rss in samples if t <= end and rss]
    chosen = inside or before[-1:]
    return statistics.median(chosen) / 2**20 if chosen else None


def flat(samples: list[tuple[float, int]], first_window: tuple[float, float], last_window: tuple[float, float]
         ) -> dict[str, Any]:
    """Median RSS over two windows (start and end times); flat when the last is within +15 % and 50 MB."""
    first, last = between(samples, *first_window), between(samples, *last_window)
    if not first or not last:
        return {"first_mb": None, "last_mb": None, "ratio": None, "flat": False}
    a, b = statistics.median(first), statistics.median(last)
    return {"first_mb": a / 2**20, "last_mb": b / 2**20, "ratio": b / a, "flat": b <= max(1.15 * a, a + 50 * 2**20)}


class Soak:
    """The processes of one soak, the threads that watch them, and what they saw (module docstring)."""

    def __init__(self, work: Path, files: int, docs_per_file: int):
        work.mkdir(parents=True, exist_ok=True)
        self.work = work
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]
                                                                ).rstrip(os.pathsep)}
        self.cli = [sys.executable, "-m", "maskstream"]
        self.corpus, self.root, self.out = work / "corpus", work / "dataset", work / "train"
        self.changer = CorpusChanger(self.corpus, files, docs_per_file)
        self.logs = {name: open(work / f"{name}.log", "w") for name in ("watch", "train", "gc")}  # noqa: SIM115
        self.stop = threading.Event()
        self.seen: dict[str, dict[str, Any]] = {}  # version -> its manifest's document counts and fingerprint check
        self.published: list[float] = []  # when each version of `seen` was first read
        self.rss: dict[str, list[tuple[float, int]]] = {"train": [], "watch": []}
        self.figures: dict[str, Any] = {"gc_runs": 0, "gc_failures": 0, "versions_collected": 0}
        self.processes: dict[str, subprocess.Popen] = {}
        self.threads: list[threading.Thread] = []
        self.ready: dict[str, float] = {}

    def read_latest(self) -> None:
        """The version `latest` names, read as soon as it is published (gc may take it later)."""
        from maskstream.schemas.manifest import load_manifest

        try:
            _, manifest = load_manifest(str(self.root))
        except Exception:  # noqa: BLE001 - no version yet, or the pointer is being replaced
            return
        if manifest.version in self.seen:
            return
        documents = manifest.source_fingerprint.get("documents", {})
        written = sum(self.changer.records.get(f["sha256"], -10**9) for f in manifest.source_fingerprint["files"])
        self.published.append(time.monotonic())
        self.seen[manifest.version] = {**documents, "records_written": written, "ok": documents.get("read") == written
                                       == documents.get("accepted", -1) + documents.get("rejected", -1)}

    def read_versions(self) -> None:
        while not self.stop.wait(0.3):
            self.read_latest()

    def sample_rss(self) -> None:
        while not self.stop.wait(2.0):
            for name, process in list(self.processes.items()):  # a copy: the main thread adds processes
                if process.poll() is None:
                    self.rss[name].append((time.monotonic(), tree_rss(process.pid)))

    def collect(self, every: float) -> None:
        while not self.stop.wait(every):
            result = subprocess.run([*self.cli, "gc", str(self.root), "--keep", "2", "--grace-minutes", "0.05"],
                                    env=self.env, capture_output=True, text=True)
            self.logs["gc"].write(result.stdout + result.stderr)
            self.figures["gc_runs"] += 1
            if result.returncode != 0:
                self.figures["gc_failures"] += 1
                continue
            self.figures["versions_collected"] += json.loads(result.stdout.strip().splitlines()[-1])["versions"]

    def thread(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def start(self, model: str, max_steps: int, timeout: float, encoder: str | None = None) -> None:
        """Watch until its first version, then the trainer until its first step. `encoder`: the watch's
        --model (default: its default, the offline MiniLM)."""
        self.processes["watch"] = watch = subprocess.Popen(
            [*self.cli, "watch", str(self.corpus), "--output", str(self.root), "--interval", "1", "--settle", "1",
             "--max-length", "64", "--shard-rows", "16", "--row-group-rows", "8",
             *(["--model", encoder] if encoder else [])],
            env=self.env, stdout=self.logs["watch"], stderr=subprocess.STDOUT)
        self.thread(self.read_versions)
        self.thread(self.sample_rss)
        deadline = time.monotonic() + timeout
        while not self.seen:
            if watch.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"watch published no version (see {self.work / 'watch.log'})")
            time.sleep(0.5)
        self.ready["watch"] = time.monotonic()
        self.processes["train"] = train = subprocess.Popen(
            [*self.cli, "train", "--dataset", str(self.root), "--follow-latest", "--output", str(self.out),
             "--model", model, "--batch-size", "8", "--max-steps", str(max_steps), "--num-workers", "1",
             "--eval-samples", "4", "--eval-every", str(max_steps), "--save-every", str(max_steps), "--log-every", "1"],
            env=self.env, stdout=self.logs["train"], stderr=subprocess.STDOUT)
        metrics = self.out / "metrics.jsonl"
        while not (metrics.exists() and '"split": "train"' in metrics.read_text()):
            if train.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the trainer took no step (see {self.work / 'train.log'})")
            time.sleep(0.5)
        self.ready["train"] = time.monotonic()

    def soak(self, versions: int, change_every: float, gc_every: float) -> str:
        """The corpus changes and gc runs until `versions` versions are published; then watch stops and
        the trainer is given time to follow the last version. Returns the trainer's log."""
        watch, train = self.processes["watch"], self.processes["train"]
        started = time.monotonic()
        self.thread(self.changer.run, change_every, self.stop)
        self.thread(self.collect, gc_every)
        deadline = started + versions * SECONDS_PER_VERSION_AT_MOST
        while len(self.seen) < versions and time.monotonic() < deadline:
            if watch.poll() is not None or train.poll() is not None:
                break
            time.sleep(1.0)
        self.ended = time.monotonic()
        self.figures["minutes"] = (self.ended - started) / 60
        self.figures["versions_requested"] = versions
        self.stop.set()
        # Stop watch (it finishes a build in progress), then let the trainer follow the last version.
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=600)
        self.read_latest()  # a version published while watch stopped
        from maskstream.schemas.manifest import load_manifest

        newest = load_manifest(str(self.root))[1].version
        deadline = time.monotonic() + 300
        train_log = self.work / "train.log"
        while current_version(train_log) != newest and train.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
        self.figures.update({"trainer_on": current_version(train_log), "newest": newest,
                             "trainer_exit_before_stop": train.poll()})
        return train_log.read_text(errors="replace")  # before it is stopped: a kill is no error

    def close(self) -> None:
        self.stop.set()
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=60)
        for thread in self.threads:
            thread.join(timeout=120)
        for log in self.logs.values():
            log.close()

    def result(self, train_log: str) -> dict[str, Any]:
        figures, seen = self.figures, self.seen
        errors = [line for line in train_log.splitlines() if ERROR_PATTERN.search(line)]
        warm_up = min(WARM_UP_VERSIONS, len(self.published) // 3)

        def at(version: int) -> float:  # when version number `version` (from 0) was published
            return self.published[min(max(version, 0), len(self.published) - 1)] if self.published else self.ended

        windows = ((at(warm_up), at(warm_up + RSS_VERSIONS)),
                   (at(len(self.published) - 1 - RSS_VERSIONS), self.ended))
        steps = [r["step"] for r in map(json.loads, (self.out / "metrics.jsonl").read_text().splitlines())
                 if r["split"] == "train"]
        figures.update({
            "versions_published": len(seen),
            "versions_accounted": sum(v["ok"] for v in seen.values()),
            "documents": {"read": sum(v.get("read", 0) for v in seen.values()),
                          "accepted": sum(v.get("accepted", 0) for v in seen.values()),
                          "rejected": sum(v.get("rejected", 0) for v in seen.values())},
            "corpus_changes": self.changer.changes - self.changer.files,
            "switches": len(SWITCH_PATTERN.findall(train_log)),
            "steps": max(steps, default=0),
            "trainer_read_errors": len(errors),
            "error_lines": errors[:5],
            "watch_build_failures": (self.work / "watch.log").read_text(errors="replace").count("build failed"),
            "rss_windows": {"warm_up_version": warm_up, "versions": RSS_VERSIONS},
            "rss": {name: flat(self.rss[name], windows[0], windows[1]) for name in self.rss},
            "rss_at_versions": {version: {name: rss_at(self.rss[name], at(version - 1), at(version))
                                          for name in self.rss}
                                for version in RSS_MARKS if version <= len(self.published)},
        })
        figures["passed"] = (figures["trainer_read_errors"] == 0 and figures["gc_failures"] == 0
                             and figures["watch_build_failures"] == 0 and figures["trainer_exit_before_stop"] is None
                             and figures["versions_accounted"] == figures["versions_published"]
                             and figures["versions_published"] >= figures["versions_requested"]
                             and figures["trainer_on"] == figures["newest"]
                             and all(r["flat"] for r in figures["rss"].values()))
        return figures


def run_soak(work: Path, versions: int = 100, files: int = 4, docs_per_file: int = 10, change_every: float = 4.0,
             gc_every: float = 3.0, max_steps: int = 1_000_000, setup_timeout: float = 600.0,
             tiny_encoder: bool = False) -> dict[str, Any]:
    """The soak of the module docstring; its figures, with `passed`. `tiny_encoder`: the watch encodes new
    words with the trainer's tiny BERT instead of the MiniLM (tests/test_soak.py: a rebuild then takes a
    second or two instead of 5-13 s, and what the soak checks does not depend on the encoder)."""
    soak = Soak(work, files, docs_per_file)
    try:
        model = tiny_bert(work / "tiny-bert")
        soak.start(model, max_steps, setup_timeout, encoder=model if tiny_encoder else None)
        train_log = soak.soak(versions, change_every, gc_every)
    finally:
        soak.close()
    return soak.result(train_log)


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
        f"soak of {figures['versions_published']} versions ({figures['versions_requested']} asked) in "
        f"{figures['minutes']:.1f} min: {'PASSED' if figures['passed'] else 'FAILED'}",
        f"  corpus changes {figures['corpus_changes']}, versions published {figures['versions_published']}, "
        f"collected by gc {figures['versions_collected']} ({figures['gc_runs']} runs, {figures['gc_failures']} failed)",
        f"  documents over all versions: read {docs['read']} = accepted {docs['accepted']} + rejected "
        f"{docs['rejected']}; versions with read = written + rejected = the records written: "
        f"{figures['versions_accounted']} of {figures['versions_published']}",
        f"  trainer: {figures['steps']} steps, {figures['switches']} switches, {figures['trainer_read_errors']} read "
        f"errors, ends on {figures['trainer_on']} (newest {figures['newest']})",
        f"  watch build failures {figures['watch_build_failures']}",
        f"  RSS, median over versions {figures['rss_windows']['warm_up_version']}+{figures['rss_windows']['versions']} "
        f"vs the last {figures['rss_windows']['versions']}: {rss}",
        *[f"  RSS at version {version}: " + ", ".join(f"{name} {mb:.0f} MB" if mb else f"{name} -"
                                                     for name, mb in by_name.items())
          for version, by_name in figures["rss_at_versions"].items()],
        *[f"  error: {line}" for line in figures["error_lines"]],
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=100, help="versions to publish (default: 100)")
    parser.add_argument("--work", default=None, help="working folder (default: a new temporary one)")
    parser.add_argument("--change-every", type=float, default=4.0, help="seconds between corpus changes (default: 4)")
    parser.add_argument("--gc-every", type=float, default=3.0, help="seconds between gc runs (default: 3)")
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="maskstream-soak-"))
    figures = run_soak(work, args.versions, change_every=args.change_every, gc_every=args.gc_every)
    print(report(figures))
    print(f"logs in {work}")
    return 0 if figures["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

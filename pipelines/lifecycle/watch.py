"""Watch a corpus folder or gs:// prefix and write a new dataset version whenever it changes.

Every --interval seconds, lists the corpus files under SOURCE (.txt, .jsonl, .parquet, also
compressed; recursively) with their sizes and modification times (GCS: generations). A change
in that listing starts a wait: only once the listing has stayed the same for --settle seconds
(a copy in progress keeps changing it) are the files fingerprinted (sha256 of their content).
When the fingerprint (paths and content hashes) differs from the one of DATASET_ROOT/latest,
it runs `maskstream update` (counting and tokenizing only the added and changed files) and
logs what changed (added, removed, changed files), what was rebuilt, and the new version.

Stopping: SIGINT or SIGTERM while idle stops at once; during a build it lets the build finish
and then stops; a second signal abandons the build. A build that is abandoned or killed
(even SIGKILL) leaves DATASET_ROOT/latest on the last complete version.

--once checks a single time (still waiting for the listing to settle), for a scheduler. Exit
status: 0 a new version was written, 3 the corpus was unchanged (nothing built), 2 bad input
(no corpus file under SOURCE, bad options), 1 the build failed.

Example:
  maskstream watch gs://bucket/corpus --output gs://bucket/dataset --interval 300
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from typing import Any

LOG = logging.getLogger("maskstream.watch")
EXIT_BUILT, EXIT_FAILED, EXIT_INPUT_ERROR, EXIT_UNCHANGED = 0, 1, 2, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from maskstream.pipelines.lifecycle.update import add_update_options

    parser.add_argument("source", metavar="SOURCE", help="folder or gs:// prefix holding the corpus files")
    parser.add_argument("--output", required=True, metavar="DATASET_ROOT", help="dataset root (local or gs://)")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between two listings (default: 60)")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="seconds the listing must stay unchanged before a build (default: 30)")
    parser.add_argument("--once", action="store_true",
                        help="check once and exit: 0 built, 3 unchanged, 2 bad input, 1 build failed (default: off)")
    add_update_options(parser)


def list_source(source: str) -> dict[str, tuple]:
    """{file URL: (size, modification stamp)} of the corpus files under `source`."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    from maskstream.pipelines.corpus import file_format

    fs, path = fsspec.core.url_to_fs(source)
    local = isinstance(fs, LocalFileSystem)
    listing = {}
    for name, info in fs.find(path, detail=True).items():
        if info.get("type") == "directory" or file_format(name) is None or "/." in "/" + name:
            continue
        stamp = info.get("generation") or info.get("mtime") or info.get("updated") or info.get("etag")
        listing[name if local else fs.unstrip_protocol(name)] = (info.get("size"), str(stamp))
    return listing


def fingerprint_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, list[str]]:
    """Files added, removed and changed (content) between two corpus fingerprints."""
    before = {f["path"]: f["sha256"] for f in (old or {}).get("files", [])}
    after = {f["path"]: f["sha256"] for f in new["files"]}
    return {
        "added": sorted(after.keys() - before.keys()),
        "removed": sorted(before.keys() - after.keys()),
        "changed": sorted(p for p in after.keys() & before.keys() if after[p] != before[p]),
    }


def latest_fingerprint(root: str) -> dict[str, Any] | None:
    from maskstream.schemas.manifest import ManifestError, load_manifest

    try:
        return load_manifest(root)[1].source_fingerprint
    except (ManifestError, FileNotFoundError):
        return None


def _summary(paths: list[str], limit: int = 5) -> str:
    return ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


class Watcher:
    """Polls SOURCE and rebuilds ROOT; `stop` (an Event) ends `run` at the next safe point."""

    def __init__(self, source: str, root: str, args: argparse.Namespace, *, interval: float, settle: float,
                 stop: threading.Event | None = None):
        self.source, self.root, self.args = source.rstrip("/"), root.rstrip("/"), args
        self.interval, self.settle = interval, settle
        self.stop = stop or threading.Event()
        self.building = False
        self._checked: dict[str, tuple] | None = None

    def settled_listing(self) -> dict[str, tuple] | None:
        """The listing once it has stayed unchanged for `settle` seconds (None when stopped)."""
        listing, since = list_source(self.source), time.monotonic()
        while not self.stop.is_set():
            if time.monotonic() - since >= self.settle:
                return listing
            self.stop.wait(min(self.interval, max(self.settle - (time.monotonic() - since), 0.01)))
            current = list_source(self.source)
            if current != listing:
                LOG.info("listing of %s is changing (%d files); waiting %.0f s for it to settle",
                         self.source, len(current), self.settle)
                listing, since = current, time.monotonic()
        return None

    def check(self) -> int:
        """One decision: EXIT_BUILT, EXIT_UNCHANGED, or an error status."""
        from maskstream.pipelines.corpus import corpus_fingerprint
        from maskstream.pipelines.lifecycle.update import leased_update, options_from_args

        listing = self.settled_listing()
        if listing is None:
            return EXIT_UNCHANGED
        if not listing:
            LOG.error("no corpus file (.txt, .jsonl, .parquet) under %s", self.source)
            return EXIT_INPUT_ERROR
        if listing == self._checked:
            return EXIT_UNCHANGED
        files = sorted(listing)
        fingerprint = corpus_fingerprint(files)
        previous = latest_fingerprint(self.root)
        changes = fingerprint_changes(previous, fingerprint)
        self._checked = listing
        if previous is not None and not any(changes.values()):
            LOG.info("corpus unchanged: %d files, fingerprint %s; nothing to build", len(files),
                     fingerprint["sha256"][:12])
            return EXIT_UNCHANGED
        self.building = True  # before the log line that announces it: a signal from here on waits for it
        LOG.info("corpus changed: %d added (%s), %d removed (%s), %d changed (%s); building",
                 len(changes["added"]), _summary(changes["added"]), len(changes["removed"]),
                 _summary(changes["removed"]), len(changes["changed"]), _summary(changes["changed"]))
        try:
            report = leased_update(options_from_args(self.args, files, self.root))
        except (ValueError, FileNotFoundError, FileExistsError, MemoryError) as e:
            LOG.error("build failed: %s", e)
            self._checked = None  # retry at the next poll
            return EXIT_INPUT_ERROR
        finally:
            self.building = False
        counts = report["counts"]
        LOG.info("built %s: counted and tokenized %d of %d files, encoded %d new words (%d from the cache), "
                 "%d sequences, seeds %s", report["version"], counts["files_processed"], counts["files"],
                 counts["words_encoded"], counts["words_from_cache"], report["rows"], " ".join(report["seeds"]))
        return EXIT_BUILT

    def run(self) -> None:
        from maskstream.pipelines.dataset.tokenizer_facts import load_backend_tokenizer
        from maskstream.pipelines.lifecycle.encoder_process import EncoderLoader
        from maskstream.pipelines.lifecycle.update import options_from_args

        LOG.info("watching %s every %g s (settle %g s), building into %s", self.source, self.interval,
                 self.settle, self.root)
        # Long-lived: start the word encoder's process now, so that the first rebuild does not wait
        # for it either (the process keeps it for every later one); the tokenizer is loaded here too.
        config = options_from_args(self.args, [], self.root).build
        load_backend_tokenizer(config.tokenizer)
        EncoderLoader(config)
        while not self.stop.is_set():
            status = self.check()
            if status == EXIT_INPUT_ERROR:
                LOG.info("will look again in %.0f s", self.interval)
            self.stop.wait(self.interval)
        LOG.info("stopped")


def run(args: argparse.Namespace) -> int:
    logging.getLogger("apache_beam.typehints.native_type_compatibility").setLevel(logging.WARNING)
    if args.interval <= 0 or args.settle < 0:
        LOG.error("--interval must be > 0 and --settle >= 0")
        return EXIT_INPUT_ERROR
    watcher = Watcher(args.source, args.output, args, interval=args.interval, settle=args.settle)

    def on_signal(signum, _frame):
        if watcher.stop.is_set() and watcher.building:
            LOG.warning("second %s: abandoning the build; latest stays on the last complete version",
                        signal.Signals(signum).name)
            raise KeyboardInterrupt
        watcher.stop.set()
        LOG.info("%s: %s", signal.Signals(signum).name,
                 "finishing the current build, then stopping (signal again to abandon it)" if watcher.building
                 else "stopping")

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        if args.once:
            return watcher.check()
        watcher.run()
    except KeyboardInterrupt:
        return 130
    return 0

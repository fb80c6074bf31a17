"""`Watcher`: polls a corpus folder or gs:// prefix and runs an incremental update (incremental.py)
whenever its files change, once their listing has settled (the command and its exit statuses:
`maskstream watch --help`, maskstream/cli/watch.py)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

from maskstream.pipelines.corpus import corpus_fingerprint, file_format
from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer
from maskstream.pipelines.update.encoder_process import EncoderLoader
from maskstream.pipelines.update.incremental import leased_update
from maskstream.pipelines.update.malloc import limit_malloc_arenas
from maskstream.pipelines.update.memory import release_unused_memory
from maskstream.pipelines.update.options import UpdateOptions
from maskstream.schemas.manifest import Manifest, ManifestError, load_manifest

LOG = logging.getLogger("maskstream.watch")
EXIT_BUILT, EXIT_FAILED, EXIT_INPUT_ERROR, EXIT_UNCHANGED = 0, 1, 2, 3


def list_source(source: str) -> dict[str, tuple]:
    """{file URL: (size, modification stamp)} of the corpus files under `source`."""
    # fsspec and its filesystems load only when a path is opened: importing this module stays light
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

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


def latest_manifest(root: str) -> Manifest | None:
    try:
        return load_manifest(root)[1]
    except (ManifestError, FileNotFoundError):
        return None


def peer_signals_differ(options: UpdateOptions, manifest: Manifest | None) -> bool:
    """Whether the peer signals asked for (`--peer-signals` and its settings) are not the latest version's."""
    have = manifest.peer_signals.get("settings") if manifest is not None and manifest.peer_signals else None
    if options.peer_signals is None:
        return have is not None
    wanted = dataclasses.asdict(options.peer_signals)
    return have is None or {name: have.get(name) for name in wanted} != wanted


def _summary(paths: list[str], limit: int = 5) -> str:
    return ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


class Watcher:
    """Polls SOURCE and rebuilds ROOT; `stop` (an Event) ends `run` at the next safe point."""

    def __init__(self, source: str, options: UpdateOptions, *, interval: float, settle: float,
                 stop: threading.Event | None = None):
        """`options`: every update's settings; each build takes its inputs from the listing of `source`
        and writes into `options.root`."""
        self.source, self.root, self.options = source.rstrip("/"), options.root.rstrip("/"), options
        self.interval, self.settle = interval, settle
        self.stop = stop or threading.Event()
        self.building = False
        self._checked: dict[str, tuple] | None = None
        # A watch rebuilds for weeks: threads of every rebuild spread glibc's free blocks over many
        # arenas, where malloc_trim cannot hand them back (docs/updates.md, "Memory").
        limit_malloc_arenas()

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
        latest = latest_manifest(self.root)
        previous = latest.source_fingerprint if latest is not None else None
        changes = fingerprint_changes(previous, fingerprint)
        self._checked = listing
        if peer_signals_differ(self.options, latest):
            LOG.info("the peer signals asked for (--peer-signals) are not the latest version's; building")
        elif previous is not None and not any(changes.values()):
            LOG.info("corpus unchanged: %d files, fingerprint %s; nothing to build", len(files),
                     fingerprint["sha256"][:12])
            return EXIT_UNCHANGED
        self.building = True  # before the log line that announces it: a signal from here on waits for it
        LOG.info("corpus changed: %d added (%s), %d removed (%s), %d changed (%s); building",
                 len(changes["added"]), _summary(changes["added"]), len(changes["removed"]),
                 _summary(changes["removed"]), len(changes["changed"]), _summary(changes["changed"]))
        try:
            report = leased_update(dataclasses.replace(self.options, inputs=files, root=self.root))
        except (ValueError, FileNotFoundError, FileExistsError, MemoryError) as e:
            LOG.error("build failed: %s", e)
            self._checked = None  # retry at the next poll
            return EXIT_INPUT_ERROR
        finally:
            self.building = False
            release_unused_memory()
        counts = report["counts"]
        LOG.info("built %s: counted and tokenized %d of %d files, encoded %d new words (%d from the cache), "
                 "%d sequences, seeds %s", report["version"], counts["files_processed"], counts["files"],
                 counts["words_encoded"], counts["words_from_cache"], report["rows"], " ".join(report["seeds"]))
        return EXIT_BUILT

    def run(self) -> None:
        LOG.info("watching %s every %g s (settle %g s), building into %s", self.source, self.interval,
                 self.settle, self.root)
        # Long-lived: start the word encoder's process now, so that the first rebuild does not wait
        # for it either (the process keeps it for every later one); the tokenizer is loaded here too.
        config = self.options.build
        load_backend_tokenizer(config.tokenizer)
        EncoderLoader(config)
        while not self.stop.is_set():
            status = self.check()
            if status == EXIT_INPUT_ERROR:
                LOG.info("will look again in %.0f s", self.interval)
            self.stop.wait(self.interval)
        LOG.info("stopped")

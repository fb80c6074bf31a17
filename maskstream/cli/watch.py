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

from maskstream.cli.update import add_update_options, update_options
from maskstream.pipelines.update.watch import EXIT_INPUT_ERROR, LOG, Watcher


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help="folder or gs:// prefix holding the corpus files")
    parser.add_argument("--output", required=True, metavar="DATASET_ROOT", help="dataset root (local or gs://)")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between two listings (default: 60)")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="seconds the listing must stay unchanged before a build (default: 30)")
    parser.add_argument("--once", action="store_true",
                        help="check once and exit: 0 built, 3 unchanged, 2 bad input, 1 build failed (default: off)")
    add_update_options(parser)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("apache_beam.typehints.native_type_compatibility").setLevel(logging.WARNING)
    if args.interval <= 0 or args.settle < 0:
        LOG.error("--interval must be > 0 and --settle >= 0")
        return EXIT_INPUT_ERROR
    try:
        options = update_options(args, [], args.output)
    except ValueError as e:
        LOG.error("%s", e)
        return EXIT_INPUT_ERROR
    watcher = Watcher(args.source, options, interval=args.interval, settle=args.settle)

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

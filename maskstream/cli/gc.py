"""Remove old dataset versions, and the cache entries no kept version uses.

Keeps, of the complete versions (those with a manifest):
  - the version `latest` names, and the --keep newest by their manifest's `created_at` (not by
    folder name: `v10` is newer than `v9` if it was built later);
  - every version that was `latest` within the last --grace-minutes: a version stops being
    `latest` when the next newer one is published, so a reader that opened it then (and cannot
    write a lease) has that long to finish with it;
  - every version a process holds a live lease on (ROOT/_leases/*.json, `maskstream/storage/lease.py`:
    `maskstream train` holds one on the version it streams, `update` and `watch` on the version
    they are building; while a build holds one, the cache is left alone too).
Removes:
  - the other complete versions;
  - incomplete versions (no manifest.json: a build that failed or was killed) whose newest file
    is older than --grace-minutes, so a version being written is never touched;
  - per-file cache entries no kept version was built from, and embedding caches of encoders no
    kept version used, also only when older than --grace-minutes (an update may be writing them);
  - leases that expired more than --grace-minutes ago.
Prints what it keeps beyond --keep and why, and what it removes (or, with --dry-run, would remove).

Example:
  maskstream gc out/dataset --keep 3
"""

from __future__ import annotations

import argparse
import json

from maskstream.pipelines.update.gc import LOG, collect_garbage


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", metavar="DATASET_ROOT", help="dataset root (local or gs://)")
    parser.add_argument("--keep", type=int, default=3,
                        help="complete versions to keep, newest first; `latest` is always kept (default: 3)")
    parser.add_argument("--grace-minutes", type=float, default=60.0,
                        help="keep versions that were `latest` this recently (a reader may still stream them) "
                             "and leave incomplete versions and cache entries younger than this alone (a build may "
                             "be writing them) (default: 60)")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed (default: off)")


def run(args: argparse.Namespace) -> int:
    try:
        removed = collect_garbage(args.root, args.keep, args.grace_minutes, args.dry_run)
    except (ValueError, FileNotFoundError) as e:
        LOG.error("%s", e)
        return 2
    for line in removed.pop("kept"):
        print(f"kept {line}" if line.startswith("cache:") else f"kept version {line}")
    verb = "would remove" if args.dry_run else "removed"
    for kind, names in removed.items():
        for name in names:
            print(f"{verb} {kind[:-1] if kind != 'incomplete' else 'incomplete version'}: {name}")
    print(json.dumps({kind: len(names) for kind, names in removed.items()}))
    return 0

"""Remove old dataset versions, and the cache entries no kept version uses.

Keeps the version `latest` names and the --keep newest complete versions (by name, which
starts with the UTC time of the build). Removes:
  - older complete versions;
  - incomplete versions (no manifest.json: a build that failed or was killed) whose newest file
    is older than --grace-minutes, so a version being written is never touched;
  - per-file cache entries no kept version was built from, and embedding caches of encoders no
    kept version used, also only when older than --grace-minutes (an update may be writing them).
Prints what it removes (or, with --dry-run, would remove).

Example:
  maskstream gc out/dataset --keep 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import posixpath
from typing import Any

LOG = logging.getLogger("maskstream.gc")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", metavar="DATASET_ROOT", help="dataset root (local or gs://)")
    parser.add_argument("--keep", type=int, default=3,
                        help="complete versions to keep, newest first; `latest` is always kept (default: 3)")
    parser.add_argument("--grace-minutes", type=float, default=60.0,
                        help="leave incomplete versions and cache entries younger than this alone: a build may "
                             "be writing them (default: 60)")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed (default: off)")


def modified_at(info: dict[str, Any]) -> float:
    """Seconds since the epoch of a file's last change, from fsspec's info (local or GCS)."""
    for key in ("mtime", "updated", "LastModified", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, str):
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def newest_change(fs, path: str) -> float:
    files = fs.find(path, detail=True)
    return max((modified_at(info) for info in files.values()), default=0.0)


def collect_garbage(root: str, keep: int, grace_minutes: float, dry_run: bool = False) -> dict[str, list[str]]:
    """Removes what the module docstring says; returns {"versions", "incomplete", "files", "embeddings"}."""
    import fsspec

    from pipelines.lifecycle.incremental import CACHE_DIR, EMBEDDINGS_DIR, FILES_DIR, entry_key
    from schemas.manifest import LATEST_POINTER, MANIFEST_NAME, Manifest

    if keep < 1:
        raise ValueError(f"--keep must be at least 1, got {keep}")
    root = root.rstrip("/")
    fs, base = fsspec.core.url_to_fs(root)
    if not fs.exists(base):
        raise FileNotFoundError(f"{root} does not exist")
    now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    old_enough = now - grace_minutes * 60
    latest = fs.cat_file(posixpath.join(base, LATEST_POINTER)).decode().strip() \
        if fs.exists(posixpath.join(base, LATEST_POINTER)) else None
    folders = sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(base, detail=False)
                     if fs.isdir(p) and posixpath.basename(p.rstrip("/")) != CACHE_DIR)
    complete = [v for v in folders if fs.exists(posixpath.join(base, v, MANIFEST_NAME))]
    kept = set(sorted(complete, reverse=True)[:keep]) | ({latest} if latest else set())
    removed: dict[str, list[str]] = {"versions": [], "incomplete": [], "files": [], "embeddings": []}
    for version in folders:
        path = posixpath.join(base, version)
        if version in kept:
            continue
        if version in complete:
            removed["versions"].append(version)
        elif newest_change(fs, path) < old_enough:
            removed["incomplete"].append(version)
    used_files, used_encoders = set(), set()
    for version in kept:
        manifest = Manifest.from_json(fs.cat_file(posixpath.join(base, version, MANIFEST_NAME)).decode())
        settings_key = manifest.config.get("file_cache_settings")
        if settings_key:
            for f in manifest.source_fingerprint.get("files", []):
                used_files.add(entry_key(settings_key, f["path"], f["sha256"]))
        if manifest.config.get("embedding_cache"):
            used_encoders.add(manifest.config["embedding_cache"])
    for kind, used, name in (("files", used_files, FILES_DIR), ("embeddings", used_encoders, EMBEDDINGS_DIR)):
        folder = posixpath.join(base, CACHE_DIR, name)
        if not fs.exists(folder):
            continue
        for entry in sorted(fs.ls(folder, detail=False)):
            key = posixpath.basename(entry.rstrip("/"))
            if key not in used and newest_change(fs, entry) < old_enough:
                removed[kind].append(key)
    if not dry_run:
        for version in removed["versions"] + removed["incomplete"]:
            fs.rm(posixpath.join(base, version), recursive=True)
        for kind, name in (("files", FILES_DIR), ("embeddings", EMBEDDINGS_DIR)):
            for key in removed[kind]:
                fs.rm(posixpath.join(base, CACHE_DIR, name, key), recursive=True)
    return removed


def run(args: argparse.Namespace) -> int:
    try:
        removed = collect_garbage(args.root, args.keep, args.grace_minutes, args.dry_run)
    except (ValueError, FileNotFoundError) as e:
        LOG.error("%s", e)
        return 2
    verb = "would remove" if args.dry_run else "removed"
    for kind, names in removed.items():
        for name in names:
            print(f"{verb} {kind[:-1] if kind != 'incomplete' else 'incomplete version'}: {name}")
    print(json.dumps({kind: len(names) for kind, names in removed.items()}))
    return 0

"""Retention: which dataset versions, cache entries and leases `maskstream gc` keeps and removes
(`collect_garbage`; the rules are in maskstream/cli/gc.py's help)."""

from __future__ import annotations

import datetime
import itertools
import logging
import posixpath
from typing import Any

from maskstream.pipelines.update.cache import CACHE_DIR, EMBEDDINGS_DIR, FILES_DIR, entry_key
from maskstream.schemas.manifest import LATEST_POINTER, MANIFEST_NAME, Manifest, ManifestError
from maskstream.storage.lease import LEASES_DIR, LeaseError, ReaderLease, parse_time

LOG = logging.getLogger("maskstream.gc")


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


def complete_versions(fs, base: str, folders: list[str]) -> list[tuple[str, float, Any]]:
    """(name, publish time, manifest) of the complete versions among `folders`, oldest first by the
    manifest's `created_at` (then its file's time, then the name). The publish time is the manifest
    file's (written last, just before `latest` moves). A manifest that cannot be read is left out:
    gc removes only what it can date. Each manifest is read once (a round trip each on gs://)."""

    dated = []
    for version in folders:
        path = posixpath.join(base, version, MANIFEST_NAME)
        if not fs.exists(path):
            continue
        try:
            manifest = Manifest.from_json(fs.cat_file(path).decode("utf-8"))
            created = parse_time(manifest.created_at).timestamp()
        except (ManifestError, ValueError, UnicodeDecodeError) as e:
            LOG.warning("leaving %s alone: its manifest cannot be read (%s)", version, e)
            continue
        dated.append((created, modified_at(fs.info(path)), version, manifest))
    return [(version, published, manifest) for _, published, version, manifest in sorted(dated, key=lambda d: d[:3])]


def live_leases(fs, base: str, now: float, grace_s: float) -> tuple[dict[str, list[str]], list[str]]:
    """({version: readers holding a live lease on it}, lease files expired longer ago than the grace)."""

    folder = posixpath.join(base, LEASES_DIR)
    held: dict[str, list[str]] = {}
    stale: list[str] = []
    if not fs.exists(folder):
        return held, stale
    for path in sorted(fs.ls(folder, detail=False)):
        if not path.endswith(".json"):
            continue
        try:
            lease = ReaderLease.from_json(fs.cat_file(path).decode("utf-8"))
        except (LeaseError, UnicodeDecodeError, FileNotFoundError) as e:  # gone meanwhile: released
            LOG.warning("ignoring %s: %s", path, e)
            continue
        expires = parse_time(lease.expires_at).timestamp()
        if expires > now:
            held.setdefault(lease.version, []).append(lease.reader)
        elif expires < now - grace_s:
            stale.append(posixpath.basename(path))
    return held, stale


def collect_garbage(root: str, keep: int, grace_minutes: float, dry_run: bool = False) -> dict[str, list[str]]:
    """Removes what the module docstring says; returns {"versions", "incomplete", "files", "embeddings",
    "leases"} removed, and under "kept" a line per version kept beyond --keep and `latest`, with why."""
    # fsspec and its filesystems load only when a path is opened: importing this module stays light
    import fsspec

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
                     if fs.isdir(p) and posixpath.basename(p.rstrip("/")) not in (CACHE_DIR, LEASES_DIR))
    complete = complete_versions(fs, base, folders)
    dated = [version for version, _, _ in complete]
    manifests = {version: manifest for version, _, manifest in complete}
    kept = set(dated[-keep:]) | ({latest} if latest else set())
    why: dict[str, str] = {}
    # A version was `latest` until the next newer one was published.
    for (version, _, _), (_, superseded_at, _) in itertools.pairwise(complete):
        if version not in kept and superseded_at >= old_enough:
            why[version] = f"was latest {(now - superseded_at) / 60:.1f} min ago (--grace-minutes {grace_minutes:g})"
    held, stale_leases = live_leases(fs, base, now, grace_minutes * 60)
    for version, readers in held.items():
        if version in folders and version not in kept:
            why[version] = f"leased by {', '.join(readers)}"
    kept |= set(why)
    # A leased version without a manifest is being built (its folder may not exist yet): the cache
    # entries it fills are used by no manifest yet, so the cache is left alone until it is published.
    building = sorted(v for v in held if v not in dated)
    removed: dict[str, list[str]] = {"versions": [], "incomplete": [], "files": [], "embeddings": [],
                                     "leases": stale_leases}
    for version in folders:
        path = posixpath.join(base, version)
        if version in kept:
            continue
        if fs.exists(posixpath.join(path, MANIFEST_NAME)):
            if version in dated:  # an unreadable manifest is left alone (complete_versions)
                removed["versions"].append(version)
        elif newest_change(fs, path) < old_enough:
            removed["incomplete"].append(version)
    used_files, used_encoders = set(), set()
    for version in kept & set(dated):
        manifest = manifests[version]
        settings_key = manifest.config.get("file_cache_settings")
        if settings_key:
            for f in manifest.source_fingerprint.get("files", []):
                used_files.add(entry_key(settings_key, f["path"], f["sha256"]))
        if manifest.config.get("embedding_cache"):
            used_encoders.add(manifest.config["embedding_cache"])
    for kind, used, name in (("files", used_files, FILES_DIR), ("embeddings", used_encoders, EMBEDDINGS_DIR)):
        folder = posixpath.join(base, CACHE_DIR, name)
        if building or not fs.exists(folder):
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
        for lease in removed["leases"]:
            fs.rm(posixpath.join(base, LEASES_DIR, lease))
    kept_lines = [f"{version}: {reason}" for version, reason in sorted(why.items())]
    if building:
        kept_lines.append(f"cache: {', '.join(building)} being built")
    return {**removed, "kept": kept_lines}

"""Following a dataset root while training: switch to the newest complete version at an epoch
boundary, when its tokenizer is the one the model was trained with.

`maskstream update` / `maskstream watch` move `ROOT/latest` only after a version is complete, so
the version `latest` names is always safe to open. A version whose tokenizer vocabulary hash
differs cannot feed the same model (its token ids mean other things): it is logged and skipped.
"""

from __future__ import annotations

import dataclasses
import logging

from schemas.manifest import Manifest, ManifestError, load_manifest

LOG = logging.getLogger("maskstream.follow")


@dataclasses.dataclass(frozen=True)
class VersionSwitch:
    version_url: str
    manifest: Manifest
    seeds_added: list[str]
    seeds_removed: list[str]


class LatestVersionFollower:
    """Remembers the version in use; `poll()` returns a VersionSwitch when `root/latest` moved to a
    compatible version, else None."""

    def __init__(self, root: str, version_url: str, manifest: Manifest):
        self.root = root.rstrip("/")
        self.version_url = version_url
        self.manifest = manifest
        self._skipped: str | None = None

    def poll(self) -> VersionSwitch | None:
        try:
            version_url, manifest = load_manifest(self.root)
        except (ManifestError, FileNotFoundError, OSError) as e:
            LOG.warning("cannot read the latest version of %s (%s); staying on %s", self.root, e, self.version_url)
            return None
        if manifest.version == self.manifest.version:
            return None
        wanted = self.manifest.tokenizer.get("vocab_hash")
        if manifest.tokenizer.get("vocab_hash") != wanted:
            if self._skipped != manifest.version:
                LOG.warning("latest version %s has another tokenizer (vocab hash %s, training uses %s); "
                            "staying on %s", manifest.version, manifest.tokenizer.get("vocab_hash"), wanted,
                            self.manifest.version)
                self._skipped = manifest.version
            return None
        old, new = set(self.manifest.seeds), set(manifest.seeds)
        switch = VersionSwitch(version_url, manifest, sorted(new - old), sorted(old - new))
        LOG.info("switching from dataset version %s to %s (%d sequences); seeds added: %s; removed: %s",
                 self.manifest.version, manifest.version, manifest.total_rows,
                 " ".join(switch.seeds_added) or "none", " ".join(switch.seeds_removed) or "none")
        self.version_url, self.manifest = version_url, manifest
        return switch

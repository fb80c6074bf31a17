"""Following a dataset root while training: switch to the newest complete version at an epoch
boundary, when its tokenizer is the one the model was trained with (and it has the peer signals, when
the masking strategy reads them).

`maskstream update` / `maskstream watch` move `ROOT/latest` only after a version is complete, so
the version `latest` names is always safe to open. A version whose tokenizer vocabulary hash
differs cannot feed the same model (its token ids mean other things): it is logged and skipped.
"""

from __future__ import annotations

import dataclasses
import logging

from maskstream.schemas.manifest import Manifest, ManifestError, load_manifest

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

    def __init__(self, root: str, version_url: str, manifest: Manifest, needs_peer_signals: bool = False):
        self.root = root.rstrip("/")
        self.version_url = version_url
        self.manifest = manifest
        self.needs_peer_signals = needs_peer_signals  # the strategy reads them: a version without them is skipped
        self._skipped: str | None = None

    def newest_compatible(self) -> str | None:
        """The URL of the version `latest` names if it is newer than the one in use and has the same
        tokenizer, else None."""
        try:
            version_url, manifest = load_manifest(self.root)
        except (ManifestError, FileNotFoundError, OSError) as e:
            LOG.warning("cannot read the latest version of %s (%s); staying on %s", self.root, e, self.version_url)
            return None
        if manifest.version == self.manifest.version:
            return None
        wanted = self.manifest.tokenizer.get("vocab_hash")
        if manifest.tokenizer.get("vocab_hash") != wanted:
            why = f"has another tokenizer (vocab hash {manifest.tokenizer.get('vocab_hash')}, training uses {wanted})"
        elif self.needs_peer_signals and not manifest.peer_signals:
            why = "has no peer signals (built without --peer-signals), which the masking strategy reads"
        else:
            return version_url
        if self._skipped != manifest.version:
            LOG.warning("latest version %s %s; staying on %s", manifest.version, why, self.manifest.version)
            self._skipped = manifest.version
        return None

    def switch_to(self, version_url: str) -> VersionSwitch:
        """Makes `version_url` the version in use; logs the switch and the seeds that changed."""
        version_url, manifest = load_manifest(version_url)
        old, new = set(self.manifest.seeds), set(manifest.seeds)
        switch = VersionSwitch(version_url, manifest, sorted(new - old), sorted(old - new))
        LOG.info("switching from dataset version %s to %s (%d sequences); seeds added: %s; removed: %s",
                 self.manifest.version, manifest.version, manifest.total_rows,
                 " ".join(switch.seeds_added) or "none", " ".join(switch.seeds_removed) or "none")
        self.version_url, self.manifest = version_url, manifest
        return switch

    def poll(self) -> VersionSwitch | None:
        version_url = self.newest_compatible()
        return self.switch_to(version_url) if version_url else None


def poll_all_ranks(follower: LatestVersionFollower, world_size: int) -> VersionSwitch | None:
    """`follower.poll()`, decided by rank 0 and the same on every rank (they must read one version)."""
    if world_size == 1:
        return follower.poll()
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch.distributed as dist

    choice = [follower.newest_compatible() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(choice, src=0)
    return follower.switch_to(choice[0]) if choice[0] else None


def dataset_root(dataset: str, version_url: str) -> str:
    """The root to follow: `dataset` itself, or the root holding it when it names a version folder."""
    dataset = dataset.rstrip("/")
    return dataset.rsplit("/", 1)[0] if dataset == version_url.rstrip("/") else dataset


def version_exists(version_url: str) -> bool:
    """Whether `version_url` is a complete version (its manifest, written last, is there). A read that
    fails for another reason (the store down after the retries, a refused permission) is raised: it
    says nothing about the version."""
    try:
        load_manifest(version_url)
    except (ManifestError, FileNotFoundError):
        return False
    return True

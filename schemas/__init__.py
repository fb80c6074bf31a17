"""`maskstream.schemas`: the contract between `maskstream.pipelines` (writers) and
`maskstream.trainer` (readers).

Arrow schemas of every output, the dataset manifest and its validation, the names and versions
of the formulas: contracts only. What a word is and how words become mask probabilities is
`maskstream.mask_signal`; how files are written, read and kept (publishing, retries, leases,
remote paths) is `maskstream.storage`; which model and loading it, `maskstream.models`. Imports
neither side.
"""

from maskstream.schemas.formulas import FORMULA_VERSIONS
from maskstream.schemas.manifest import (
    LATEST_POINTER,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Manifest,
    ManifestError,
    ShardEntry,
)
from maskstream.schemas.tables import (
    REJECT_SCHEMA,
    SEQUENCE_SCHEMA,
    WORD_STATS_SCHEMA,
    WORD_TABLE_SCHEMA,
)

__all__ = [
    "FORMULA_VERSIONS",
    "LATEST_POINTER",
    "MANIFEST_NAME",
    "REJECT_SCHEMA",
    "SCHEMA_VERSION",
    "SEQUENCE_SCHEMA",
    "WORD_STATS_SCHEMA",
    "WORD_TABLE_SCHEMA",
    "Manifest",
    "ManifestError",
    "ShardEntry",
]

"""The contract between `pipelines/` (writers) and `trainer/` (readers).

Arrow schemas of every output, the dataset manifest and its validation, the word
normalization, and the names and versions of the formulas. Imports neither side.
"""

from schemas.formulas import FORMULA_VERSIONS
from schemas.manifest import (
    LATEST_POINTER,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Manifest,
    ManifestError,
    ShardEntry,
)
from schemas.models import default_model
from schemas.tables import (
    REJECT_SCHEMA,
    SEQUENCE_SCHEMA,
    WORD_STATS_SCHEMA,
    WORD_TABLE_SCHEMA,
)
from schemas.words import normalize_word, word_spans, words

__all__ = [
    "FORMULA_VERSIONS",
    "LATEST_POINTER",
    "MANIFEST_NAME",
    "REJECT_SCHEMA",
    "SCHEMA_VERSION",
    "SEQUENCE_SCHEMA",
    "WORD_STATS_SCHEMA",
    "WORD_TABLE_SCHEMA",
    "default_model",
    "Manifest",
    "ManifestError",
    "ShardEntry",
    "normalize_word",
    "word_spans",
    "words",
]

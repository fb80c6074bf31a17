"""Arrow schemas of every table maskstream writes.

Writers cast to these schemas before writing; readers check them with `check_schema`.
"""

from __future__ import annotations

import pyarrow as pa

# `maskstream stats`: one row per word of the domain corpus.
WORD_STATS_SCHEMA = pa.schema(
    [
        pa.field("word", pa.string(), nullable=False),
        pa.field("tf", pa.int64(), nullable=False),  # occurrences in the domain corpus
        pa.field("df", pa.int64(), nullable=False),  # documents that contain the word
        pa.field("general_frequency", pa.float64(), nullable=False),  # f_G(w), 0 when unseen
        pa.field("tf_icf", pa.float64(), nullable=False),
    ]
)

# `maskstream stats --background-input`: the same rows plus the background contrast.
WORD_STATS_BACKGROUND_SCHEMA = pa.schema(
    [
        *WORD_STATS_SCHEMA,
        pa.field("background_frequency", pa.float64(), nullable=False),  # f_B(w), 0 when unseen
        pa.field("contrast", pa.float64(), nullable=False),  # tf_icf * max(0, log(p_D / f_B)), see formulas
    ]
)

# Every stage: one row per rejected input record, so that read = accepted + rejected.
REJECT_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),  # file path or URL
        pa.field("location", pa.string(), nullable=False),  # e.g. "line 17", "row 3", "file"
        pa.field("reason", pa.string(), nullable=False),
    ]
)

# `maskstream build`: one row per word type of the dataset version (the word table).
WORD_TABLE_SCHEMA = pa.schema(
    [
        pa.field("word", pa.string(), nullable=False),
        pa.field("word_index", pa.int32(), nullable=False),  # what `word_index` in shards points to
        pa.field("similarity", pa.float32(), nullable=False),  # to the nearest seed (or mean/centroid)
        pa.field("nearest_seed", pa.string(), nullable=False),
    ]
)

# `maskstream build --peer-signals`: PMI-Masking's collocation vocabulary, best first
# (pipelines/statistics/peer_formulas.py has the formulas).
COLLOCATION_SCHEMA = pa.schema(
    [
        pa.field("ngram", pa.string(), nullable=False),  # its words joined by one space
        pa.field("n", pa.int8(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),  # occurrences inside phrases
        pa.field("pmi", pa.float64(), nullable=False),  # pmi_n: the least PMI over its cuts
        pa.field("word_index", pa.list_(pa.int32()), nullable=False),  # its words' rows of the word table
    ]
)

# `maskstream build --peer-signals`: InforMask's informative relevance, one row per word type by word_index.
INFORMATIVENESS_SCHEMA = pa.schema(
    [
        pa.field("word_index", pa.int32(), nullable=False),
        pa.field("sentences", pa.int64(), nullable=False),  # sentences holding the word
        pa.field("relevance", pa.float64(), nullable=False),  # mean sum of its PMI with its sentences' words
        pa.field("mask_weight", pa.float32(), nullable=False),  # average rank of relevance / word types, in (0, 1]
    ]
)

# `maskstream build`: one row per training sequence, in shards. No padding is stored.
# List columns all have the sequence's length.
SEQUENCE_SCHEMA = pa.schema(
    [
        pa.field("sequence_id", pa.int64(), nullable=False),  # dense 0..rows-1 over the version
        pa.field("document_id", pa.string(), nullable=False),  # "<source>:<line|row>" of the first document
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        # Word occurrence within the sequence (0, 1, 2, ...): all subword tokens of one word share it;
        # a token outside any word (punctuation) is its own occurrence; special tokens -1.
        pa.field("word_ids", pa.list_(pa.int32()), nullable=False),
        # The word type behind each token, a row of the word table; -1 for specials and punctuation.
        pa.field("word_index", pa.list_(pa.int32()), nullable=False),
        pa.field("special_tokens_mask", pa.list_(pa.int8()), nullable=False),  # 1 for special tokens
        # Per-token probability of being masked; float32; sums to budget x non-special tokens.
        pa.field("mask_probability", pa.list_(pa.float32()), nullable=False),
    ]
)


class SchemaMismatch(ValueError):
    """A table does not have the schema the contract declares."""


def check_schema(actual: pa.Schema, expected: pa.Schema, what: str) -> None:
    """Raises SchemaMismatch naming `what` unless `actual` has every field of `expected` with its type."""
    missing = [f.name for f in expected if f.name not in actual.names]
    wrong = [
        f"{f.name}: {actual.field(f.name).type} (expected {f.type})"
        for f in expected
        if f.name in actual.names and actual.field(f.name).type != f.type
    ]
    if missing or wrong:
        raise SchemaMismatch(f"{what}: missing columns {missing}, wrong types {wrong}")

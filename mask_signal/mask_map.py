"""A dataset version's masking signal, applied at load time to any text: `MaskMap`.

A version's per-token mask probabilities are a pure function of its word table (each word type's
similarity to its nearest seed), the word definition (`maskstream.mask_signal.words`, aligned to tokens
by `maskstream.mask_signal.alignment`) and the masking settings the version was built with (map, alpha,
sharpness, floor, budget). `MaskMap` holds exactly that, so the same probabilities come out for any
text tokenized by the version's tokenizer, with no Beam and no shards:

    from maskstream import MaskMap
    mask_map = MaskMap.from_version("gs://bucket/dataset")        # or MaskMap.load(EXPORTED_DIR)
    probabilities = mask_map.probabilities(texts, tokenizer, max_length=128)

`probabilities(...)[i]` lines up with `tokenizer(texts, truncation=True, max_length=...)["input_ids"][i]`.
A word missing from the table weighs 0, as in the build; special tokens get 0; a sequence's
probabilities sum to the budget times its non-special tokens by the build's rule
(`maskstream.mask_signal.probability`). The build cuts a long document at a word start
while the tokenizer's truncation may cut inside a word: the tokens of that last word keep the word's
weight (the word is read from the whole text).

Memory: 16 bytes a word type (a 64-bit hash, its row, its similarity), within the build's word lookup
(`maskstream.mask_signal.word_lookup`); the words' text is never held.

`maskstream export-map VERSION --output DIR` writes what `MaskMap.load(DIR)` reads (`export_mask_map`):
`mask_map.json` (settings, tokenizer, the version's identity and provenance), `words.parquet` (word,
similarity) and `token_mask_probability.json`, an InforMask-style table of each token id's mean mask
probability over the version's sequences, for loops that take only such a table.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from maskstream.mask_signal.alignment import token_words
from maskstream.mask_signal.peer_lookup import PeerSignals
from maskstream.mask_signal.probability import MaskSettings, mask_probabilities_flat
from maskstream.mask_signal.word_lookup import WordLookup
from maskstream.schemas.manifest import (
    Manifest,
    load_manifest,
    read_word_table,
    safe_relative_path,
    vocab_hash,
)

MAP_NAME = "mask_map.json"
WORDS_NAME = "words.parquet"
TOKEN_TABLE_NAME = "token_mask_probability.json"
MAP_FORMAT = 1


class TokenizerMismatch(ValueError):
    """A tokenizer other than the one the map's version was built with."""


class MaskMap:
    """Word type -> similarity (as sorted 64-bit hashes), plus the settings that turn similarities into
    per-token mask probabilities and the identity of the version and tokenizer they came from.

    Made by `from_version` (or `of_words`) rather than by hand. lookup: the WordLookup from a word to
    its word_index. similarity: each word_index's similarity to its nearest seed. settings: the build's
    probability settings (budget, alpha, weighting, sharpness, floor). tokenizer: the manifest's
    tokenizer entry (its vocabulary hash is checked against the tokenizer a text is masked with).
    identity: where the map came from (version, manifest digest), for logs and reports.
    peer_signals: the version's PeerSignals (`--peer-signals`), for the strategies that read them.
    """

    def __init__(self, lookup: WordLookup, similarity: np.ndarray, settings: MaskSettings | Mapping[str, Any],
                 tokenizer: dict[str, Any], identity: dict[str, Any], peer_signals: PeerSignals | None = None) -> None:
        self.lookup = lookup
        self.peer_signals = peer_signals  # the version's collocations and informativeness, if it has them
        self.similarity = np.asarray(similarity, np.float32)  # by word_index
        self.settings = settings if isinstance(settings, MaskSettings) else MaskSettings.of(settings)
        self.tokenizer = dict(tokenizer)
        self.identity = dict(identity)
        self._checked: set[int] = set()  # ids of tokenizers whose vocab hash matched

    @classmethod
    def of_words(cls, words: pa.Array | pa.ChunkedArray, word_index: np.ndarray, similarity: np.ndarray,
                 settings: MaskSettings | Mapping[str, Any], tokenizer: dict[str, Any], identity: dict[str, Any],
                 peer_signals: PeerSignals | None = None) -> MaskMap:
        """From a word table's columns (any order)."""
        words = words.combine_chunks() if isinstance(words, pa.ChunkedArray) else words
        word_index = np.asarray(word_index, np.int32)
        dense = np.zeros(int(word_index.max(initial=-1)) + 1, np.float32)
        dense[word_index] = np.asarray(similarity, np.float32)
        return cls(WordLookup.indexed(words, word_index), dense, settings, tokenizer, identity, peer_signals)

    @classmethod
    def from_version(cls, dataset: str) -> MaskMap:
        """The map of a dataset version: a version folder or a dataset root (its latest), local or gs://."""
        version_url, manifest = load_manifest(dataset)
        table = read_word_table(version_url, manifest.word_table, columns=["word", "word_index", "similarity"])
        return cls.of_words(table.column("word"), table.column("word_index").to_numpy(),
                            table.column("similarity").to_numpy(), manifest.config, manifest.tokenizer,
                            version_identity(version_url, manifest),
                            PeerSignals.load(version_url, manifest) if manifest.peer_signals else None)

    @classmethod
    def load(cls, folder: str) -> MaskMap:
        """A map written by `maskstream export-map` (`export_mask_map`), local or gs://."""
        with fsspec.open(posixpath.join(folder, MAP_NAME), "r", encoding="utf-8") as f:
            document = json.load(f)
        if document.get("format") != MAP_FORMAT:
            raise ValueError(f"{folder}/{MAP_NAME}: map format {document.get('format')!r}; this maskstream reads "
                             f"{MAP_FORMAT}")
        with fsspec.open(posixpath.join(folder, WORDS_NAME), "rb") as f:
            table = pq.read_table(f)
        peer_signals = PeerSignals.read(folder, document["peer_signals"]) if "peer_signals" in document else None
        return cls.of_words(table.column("word"), np.arange(table.num_rows), table.column("similarity").to_numpy(),
                            document["settings"], document["tokenizer"], document["version"], peer_signals)

    def __len__(self) -> int:
        return len(self.lookup)

    @property
    def nbytes(self) -> int:
        return self.lookup.nbytes + self.similarity.nbytes

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(self.settings).items())
        return f"MaskMap({len(self):,} word types of {self.identity.get('url')}, {options})"

    def check_tokenizer(self, tokenizer: Any, allow_other_tokenizer: bool = False) -> None:
        """Refuses (TokenizerMismatch, one line) a tokenizer whose vocabulary is not the map's, unless
        `allow_other_tokenizer`: the words still apply, but the version's figures do not."""
        if allow_other_tokenizer or id(tokenizer) in self._checked:
            return
        theirs, ours = vocab_hash(tokenizer.get_vocab()), self.tokenizer.get("vocab_hash")
        if theirs != ours:
            raise TokenizerMismatch(
                f"tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)} (vocab hash {theirs[:12]}) "
                f"is not the map's {self.tokenizer.get('name')} (vocab hash {str(ours)[:12]}); pass "
                "allow_other_tokenizer=True to apply the map's words to it anyway")
        self._checked.add(id(tokenizer))

    def probabilities(self, texts: Sequence[str], tokenizer: Any, max_length: int | None = None,
                      allow_other_tokenizer: bool = False) -> list[np.ndarray]:
        """float32 mask probabilities per token of `tokenizer(texts, truncation=True, max_length=...)`
        (`max_length` defaults to the version's)."""
        self.check_tokenizer(tokenizer, allow_other_tokenizer)
        max_length = max_length or int(self.settings.max_length)
        texts = list(texts)
        encoded = tokenizer(texts, truncation=True, max_length=max_length, return_offsets_mapping=True,
                            return_special_tokens_mask=True)
        _, p, offsets = self.token_signal(texts, encoded["offset_mapping"], encoded["special_tokens_mask"],
                                          width=max_length)
        return [p[offsets[i] : offsets[i + 1]] for i in range(len(texts))]

    def token_signal(self, texts: Sequence[str], offset_mapping: Sequence[Sequence], special_tokens_mask: Sequence,
                     width: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(word ids, mask probabilities, row offsets) of encoded texts, flat: row i is
        `[offsets[i], offsets[i + 1])`. `offset_mapping` are each token's character offsets into its
        text; special tokens get word id -1 and probability 0. Rows are padded to `width` inside, as
        the build pads to its max length, so a row's result does not depend on its batch."""
        word_ids, _, p, offsets = self.token_words_and_signal(texts, offset_mapping, special_tokens_mask, width)
        return word_ids, p, offsets

    def token_words_and_signal(self, texts: Sequence[str], offset_mapping: Sequence[Sequence],
                               special_tokens_mask: Sequence,
                               width: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`token_signal` with each token's word_index too (-1 outside the map's words): (word ids,
        word_index, mask probabilities, row offsets)."""
        special = [np.asarray(s, np.int8).reshape(-1) for s in special_tokens_mask]
        lengths = np.fromiter(map(len, special), np.int64, len(special))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if not len(texts) or offsets[-1] == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), offsets
        flat_special = np.concatenate(special)
        pairs = np.concatenate([np.asarray(o, np.int64).reshape(-1, 2) for o in offset_mapping])
        keep = flat_special == 0
        counts = np.bincount(np.repeat(np.arange(len(lengths)), lengths)[keep], minlength=len(lengths))
        occurrence, rows, _ = token_words(texts, counts, pairs[keep], self.lookup)
        word_ids = np.full(len(flat_special), -1, np.int64)
        word_index = np.full(len(flat_special), -1, np.int64)
        word_ids[keep], word_index[keep] = occurrence, rows
        p = mask_probabilities_flat(word_ids, word_index, flat_special, offsets, self.similarity,
                                    **{**self.settings.options(), "width": width})
        return word_ids, word_index, p, offsets


def version_identity(version_url: str, manifest: Manifest) -> dict[str, Any]:
    """What names a version's map: where it is, when it was built, from what corpus and seeds."""
    return {"url": version_url, "version": manifest.version, "created_at": manifest.created_at,
            "source_sha256": manifest.source_fingerprint.get("sha256"), "seeds": list(manifest.seeds),
            "formulas": manifest.formulas, "word_types": manifest.vocabulary.get("word_types")}


def token_mask_probability(version_url: str, manifest: Manifest) -> tuple[np.ndarray, np.ndarray]:
    """(mean mask probability, occurrences) of every token id over a version's sequences, read a row
    group at a time. An id that never occurs gets the mean over all non-special tokens; specials 0."""
    size = int(manifest.tokenizer["vocab_size"])
    total, count = np.zeros(size, np.float64), np.zeros(size, np.int64)
    for shard in manifest.shards:
        with fsspec.open(f"{version_url}/{safe_relative_path(shard.path)}", "rb") as f:
            parquet = pq.ParquetFile(f)
            for group in range(parquet.num_row_groups):
                rows = parquet.read_row_group(group, columns=["input_ids", "mask_probability", "special_tokens_mask"])
                ids = rows.column("input_ids").combine_chunks().flatten().to_numpy()
                p = rows.column("mask_probability").combine_chunks().flatten().to_numpy()
                keep = rows.column("special_tokens_mask").combine_chunks().flatten().to_numpy() == 0
                keep &= ids < size  # an id past vocab_size (a token added after the vocab) has no slot
                total += np.bincount(ids[keep], weights=p[keep], minlength=size)
                count += np.bincount(ids[keep], minlength=size)
    mean = np.divide(total, count, out=np.full(size, total.sum() / max(count.sum(), 1)), where=count > 0)
    mean[[i for i in manifest.tokenizer.get("all_special_ids", []) if 0 <= i < size]] = 0.0
    return mean, count


def export_mask_map(dataset: str, output: str) -> dict[str, Any]:
    """Writes a version's map to `output` (local or gs://): mask_map.json, words.parquet and
    token_mask_probability.json. Returns each file's bytes and the counts."""
    version_url, manifest = load_manifest(dataset)
    table = read_word_table(version_url, manifest.word_table, columns=["word", "word_index", "similarity"])
    table = table.sort_by("word_index")
    if not np.array_equal(table.column("word_index").to_numpy(), np.arange(table.num_rows)):
        raise ValueError(f"{version_url}: the word table's word_index is not 0..{table.num_rows - 1}")
    mean, count = token_mask_probability(version_url, manifest)
    document = {
        "format": MAP_FORMAT,
        "settings": dataclasses.asdict(MaskSettings.of(manifest.config)),
        "tokenizer": manifest.tokenizer,
        "version": version_identity(version_url, manifest),
        "exported": {"by": f"maskstream {importlib.metadata.version('maskstream')}", "at": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds")},
        "files": {WORDS_NAME: "word, similarity to the nearest seed; a word's row is its word_index",
                  TOKEN_TABLE_NAME: "token id -> mean mask probability over the version's sequences "
                                    "(ids never seen: the mean of all tokens; specials: 0)"},
    }
    tokens = {"mask_probability": [round(float(v), 7) for v in mean], "occurrences": count.tolist()}
    words = pa.table({"word": table.column("word"), "similarity": table.column("similarity")})
    peer_files = {}
    if manifest.peer_signals:  # the strategies that read them work on text too (DifferenceMaskingCollator)
        entry = manifest.peer_signals
        document["peer_signals"] = {"collocations": entry["collocations"], "informativeness": entry["informativeness"],
                                    "settings": entry["settings"], "formulas": entry["formulas"]}
        document["files"].update({entry["collocations"]: "the version's collocations (PMI-Masking)",
                                  entry["informativeness"]: "the version's informativeness (InforMask)"})
        peer_files = {name: posixpath.join(version_url, name)
                      for name in (entry["collocations"], entry["informativeness"])}
    sizes = write_mask_map(output, document, words, tokens, peer_files)
    return {"output": output, "word_types": table.num_rows, "token_ids": len(mean),
            "tokens_seen": int((count > 0).sum()), "bytes": sizes, "total_bytes": sum(sizes.values())}


def write_mask_map(output: str, document: dict[str, Any], words: pa.Table, tokens: dict[str, Any],
                   copied: Mapping[str, str] | None = None) -> dict[str, int]:
    """The three files of an exported map, and `copied` (name -> the version's file URL); returns each
    file's bytes."""
    fs, root = fsspec.core.url_to_fs(output)
    fs.makedirs(root, exist_ok=True)
    for name, url in (copied or {}).items():
        with fsspec.open(url, "rb") as source, fs.open(posixpath.join(root, name), "wb") as f:
            f.write(source.read())
    with fs.open(posixpath.join(root, WORDS_NAME), "wb") as f:
        pq.write_table(words, f, compression="zstd")
    for name, value in ((TOKEN_TABLE_NAME, tokens), (MAP_NAME, document)):
        with fs.open(posixpath.join(root, name), "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1 if name == MAP_NAME else None)
    return {name: fs.size(posixpath.join(root, name)) for name in (MAP_NAME, WORDS_NAME, TOKEN_TABLE_NAME,
                                                                   *(copied or {}))}

"""Does a tokenizer map its tokens to the right words? `word_decode_report` decodes every word
occurrence of a corpus sample and counts the words whose tokens do not decode to them
(`maskstream check-tokenizer`); `read_texts` reads the sample."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from maskstream.mask_signal.alignment import align_tokens_to_words
from maskstream.mask_signal.words import WORD_PATTERN, word_boundaries
from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer

SHIPPED_SAMPLE = "data/debian-science.jsonl"
SEPARATOR = "\u00a6"  # ¦: kept by NFKC, lower-casing and accent stripping, never part of a word
NOT_WORD = re.compile(r"[^\w\u00a6]|_")


def read_texts(path: str, text_field: str, limit: int) -> list[str]:
    """The first `limit` non-empty texts of a .jsonl, .txt or .parquet file."""
    # fsspec and its filesystems load only when a path is opened: importing this module stays light
    import fsspec

    if path.endswith(".parquet"):
        # heavy: this pyarrow module loads only when data is read: importing this module stays light
        import pyarrow.parquet as pq

        with fsspec.open(path, "rb") as f:
            table = pq.read_table(f, columns=[text_field])
        texts = table.column(text_field).to_pylist()
    else:
        texts = []
        with fsspec.open(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if len(texts) >= limit:
                    break
                if path.endswith(".jsonl"):
                    try:
                        texts.append(json.loads(line)[text_field])
                    except (ValueError, KeyError, TypeError) as e:
                        raise ValueError(f"{path}:{number}: no JSON object with a {text_field!r} string ({e})") from e
                else:
                    texts.append(line.rstrip("\n"))
    return [t for t in texts if isinstance(t, str) and t.strip()][:limit]


def word_decode_report(model: str, texts: Sequence[str], examples: int = 5) -> dict[str, Any]:
    """For every word occurrence of `texts` (`maskstream.mask_signal.words.WORD_PATTERN`): do the tokens the
    build assigns to it decode to it? Counts: `words`, `right` (one word per occurrence unit),
    `joined` (right, in a unit of several words joined by a token across them), `wrong`
    (mis-decoded, or given tokens of two units, or none), `tokens_across_words`."""
    # loaded where used: importing this module stays light
    import numpy as np

    backend = load_backend_tokenizer(model)
    normalize = backend.normalizer.normalize_str if backend.normalizer is not None else (lambda s: s)

    def letters(text: str) -> str:
        return "".join(WORD_PATTERN.findall(text))

    def per_unit_letters(texts: list[str]) -> list[str]:
        return NOT_WORD.sub("", SEPARATOR.join(texts)).split(SEPARATOR)

    counts = {"documents": len(texts), "words": 0, "right": 0, "joined": 0, "wrong": 0, "tokens_across_words": 0}
    wrong_examples: list[str] = []
    for start in range(0, len(texts), 256):
        batch = texts[start : start + 256]
        encodings = backend.encode_batch(batch, add_special_tokens=False)
        units, expected, unit_words = [], [], []
        for text, encoding in zip(batch, encodings, strict=True):
            # The words as the regex finds them (independent of the build's code-point table).
            words = [(m.start(), m.end()) for m in WORD_PATTERN.finditer(text)]
            counts["words"] += len(words)
            offsets = np.asarray(encoding.offsets, np.int64).reshape(-1, 2)
            span_starts, span_ends = word_boundaries(text)
            occurrence, span, across = align_tokens_to_words(offsets[:, 0], offsets[:, 1], span_starts, span_ends)
            counts["tokens_across_words"] += across
            word_starts = np.array([s for s, _ in words], np.int64)
            word_ends = np.array([e for _, e in words], np.int64)
            # Units: runs of tokens with a word sharing an occurrence id (ids never decrease).
            tokens = np.flatnonzero(span >= 0)
            first = np.flatnonzero(np.diff(occurrence[tokens], prepend=-1) != 0)
            covered = np.zeros(len(words) + 1, np.int64)
            if len(tokens):
                low = np.minimum.reduceat(offsets[tokens, 0], first)
                high = np.maximum.reduceat(offsets[tokens, 1], first)
                # The words its tokens' characters reach: word_from..word_to.
                word_from = np.searchsorted(word_ends, low, side="right")
                word_to = np.searchsorted(word_starts, high, side="left")
                np.add.at(covered, word_from, 1)
                np.add.at(covered, word_to, -1)
                ids = np.asarray(encoding.ids, np.int64)[tokens].tolist()
                bounds = [*first.tolist(), len(ids)]
                units.extend(ids[x:y] for x, y in zip(bounds[:-1], bounds[1:], strict=True))
                for a, b in zip(word_from.tolist(), word_to.tolist(), strict=True):
                    expected.append("".join(text[s:e] for s, e in words[a:b]))
                    unit_words.append((text, words[a:b]))
            covered = np.cumsum(covered)[:-1]
            missing = np.flatnonzero(covered != 1)  # no tokens, or tokens in two units
            counts["wrong"] += len(missing)
            wrong_examples.extend(f"{text[word_starts[k]:word_ends[k]]!r}: tokens in {covered[k]} units"
                                  for k in missing[: max(examples - len(wrong_examples), 0)])
        decoded = backend.decode_batch(units, skip_special_tokens=False)
        # Normalized and stripped to letters and digits a batch at a time, units joined by a
        # separator no normalizer touches (unit by unit where a decoded unit holds one).
        theirs = per_unit_letters(decoded)
        wanted = per_unit_letters(normalize(SEPARATOR.join(expected)).split(SEPARATOR))
        if len(theirs) != len(decoded) or len(wanted) != len(expected):
            theirs = [letters(got) for got in decoded]
            wanted = [letters(normalize(want)) for want in expected]
        for got, want, mine, (text, reached) in zip(theirs, wanted, decoded, unit_words, strict=True):
            if got == want:
                counts["right" if len(reached) == 1 else "joined"] += len(reached)
            else:
                counts["wrong"] += len(reached)
                if len(wrong_examples) < examples:
                    spelled = " ".join(text[s:e] for s, e in reached)
                    wrong_examples.append(f"{spelled!r}: its tokens decode to {mine!r}")
    counts["fraction_right"] = (counts["right"] + counts["joined"]) / max(counts["words"], 1)
    return {**counts, "wrong_examples": wrong_examples}

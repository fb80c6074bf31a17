"""Difference masking on raw text at load time (`DifferenceMaskingCollator`) vs the Hugging Face
whole-word collator, and the size of an exported map.

    python -m benchmarks.mask_map [--corpus data/debian-science.jsonl] [--version DATASET] [--batches 10]

1. Raw text in, masked batch out, one CPU thread, batch 64 and 256 of real Debian descriptions
   truncated to 128 tokens (MiniLM tokenizer). Both sides tokenize: ours calls
   `DifferenceMaskingCollator(texts)` (tokenize with offsets, word alignment, per-token probabilities,
   collate, mask); the peer tokenizes with offsets and calls `DataCollatorForLanguageModeling(
   whole_word_mask=True)` (transformers 5.x has no `DataCollatorForWholeWordMask`; the flag is its
   successor). CPU seconds per batch, best of 5 rounds; the ratio is the peer's time over ours.
2. The export's size: `maskstream export-map`'s three files for this map, and for 1 M word types
   (random lower-case words with the corpus's word-length distribution: zstd compresses them
   worse than real words, so the figure is an upper bound).

The map is `--version`'s, or, by default, one made here from the corpus's word types with
similarities drawn around 0.2 +- 0.1 (a sentence encoder's spread, docs/signal.md): the cost does
not depend on which similarities the words have.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from benchmarks.masking import timed
from maskstream.mask_signal.mask_map import MAP_FORMAT, MaskMap, write_mask_map
from maskstream.mask_signal.words import words
from maskstream.schemas.manifest import vocab_hash
from testing import sequence_dataset as factory

LENGTH = 128
BATCHES = (64, 256)
SETTINGS = {"budget": 0.15, "alpha": 1.0, "weighting": "similarity", "sharpness": 1.0, "floor": 0.0,
            "max_length": LENGTH}


def corpus_map(texts: list[str], tokenizer) -> tuple[MaskMap, pa.Table]:
    """A map over the corpus's word types, similarities ~ N(0.2, 0.1) clipped to [-1, 1]."""
    types = sorted(Counter(w for t in texts for w in words(t)))
    similarity = np.clip(np.random.default_rng(0).normal(0.2, 0.1, len(types)), -1, 1).astype(np.float32)
    identity = {"name": tokenizer.name_or_path, "vocab_hash": vocab_hash(tokenizer.get_vocab())}
    table = pa.table({"word": pa.array(types, pa.string()), "similarity": similarity})
    return MaskMap.of_words(table.column("word"), np.arange(len(types)), similarity, SETTINGS, identity,
                            {"url": "made by benchmarks/mask_map.py"}), table


def speed_table(mask_map: MaskMap, texts: list[str], tokenizer, repeats: int) -> None:
    from transformers import DataCollatorForLanguageModeling

    from maskstream import DifferenceMaskingCollator

    hf = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, whole_word_mask=True)

    def peer(batch: list[str]) -> dict:
        # Padded by the tokenizer: the collator cannot pad `offset_mapping`, which whole-word masking needs.
        encoded = tokenizer(batch, truncation=True, max_length=LENGTH, padding=True, return_offsets_mapping=True,
                            return_special_tokens_mask=True)
        return hf([{k: encoded[k][i] for k in encoded} for i in range(len(batch))])

    print(f"\n## Raw text in, masked batch out: 1 CPU thread, {LENGTH} tokens, real Debian text, tokenizing "
          "counted on both sides\n")
    print("| batch | method | ms/batch | texts/s | masked tokens/batch | HF time / ours |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for size in BATCHES:
        batch = texts[:size]
        hf_seconds = timed(lambda b=batch: peer(b), repeats)
        hf_masked = int((peer(batch)["labels"] != -100).sum())
        print(f"| {size} | HF DataCollatorForLanguageModeling(whole_word_mask=True) | {hf_seconds * 1e3:.1f} | "
              f"{size / hf_seconds:,.0f} | {hf_masked} | 1.00 |")
        for strategy, label in (("difference", "maskstream DifferenceMaskingCollator, difference"),
                                ("whole_word", "maskstream DifferenceMaskingCollator, whole_word")):
            collator = DifferenceMaskingCollator(mask_map, tokenizer, strategy, max_length=LENGTH)
            seconds = timed(lambda b=batch, c=collator: c(b), repeats)
            masked = int((collator(batch)["labels"] != -100).sum())
            print(f"| {size} | {label} | {seconds * 1e3:.1f} | {size / seconds:,.0f} | {masked} | "
                  f"{hf_seconds / seconds:.2f} |")


def size_table(table: pa.Table, tokenizer) -> None:
    print("\n## Size of an exported map (mask_map.json, words.parquet, token_mask_probability.json)\n")
    print("| word types | words.parquet | token table | mask_map.json | total | in memory (MaskMap.nbytes) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    rng = np.random.default_rng(1)
    lengths = np.array([len(w) for w in table.column("word").to_pylist()])
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    distinct: set[str] = set()
    while len(distinct) < 1_000_000:  # short lengths run out of spellings: draw until a million are distinct
        distinct.update(bytes(rng.choice(letters, n)).decode() for n in rng.choice(lengths, 1_000_000 - len(distinct)))
    million = sorted(distinct)
    vocabulary = len(tokenizer)
    tokens = {"mask_probability": [round(float(v), 7) for v in rng.uniform(0, 0.3, vocabulary)],
              "occurrences": rng.integers(0, 10**6, vocabulary).tolist()}
    document = {"format": MAP_FORMAT, "settings": SETTINGS, "tokenizer": {"vocab_hash": "0" * 64}, "version": {}}
    for name, words_table in (("this corpus", table),
                              ("1 M (synthetic)", pa.table({"word": pa.array(million, pa.string()),
                                                            "similarity": rng.normal(0.2, 0.1, len(million))
                                                            .astype(np.float32)}))):
        with tempfile.TemporaryDirectory() as folder:
            sizes = write_mask_map(folder, document, words_table, tokens)
            loaded = MaskMap.load(folder)
        print(f"| {words_table.num_rows:,} ({name}) | {sizes['words.parquet'] / 1e6:.2f} MB | "
              f"{sizes['token_mask_probability.json'] / 1e6:.2f} MB | {sizes['mask_map.json']:,} B | "
              f"{sum(sizes.values()) / 1e6:.2f} MB | {loaded.nbytes / 1e6:.1f} MB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=factory.SAMPLE_CORPUS, help="JSONL corpus with a text field")
    parser.add_argument("--version", default=None, help="a dataset version whose map to use (default: one made here)")
    parser.add_argument("--batches", type=int, default=10, help="timed batches per round (default: 10)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import transformers

    tokenizer = factory.tokenizer()
    texts = factory.read_texts(args.corpus)
    mask_map, table = corpus_map(texts, tokenizer)
    if args.version:
        mask_map = MaskMap.from_version(args.version)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {len(texts)} texts of "
          f"{args.corpus.name}; {mask_map}")
    speed_table(mask_map, texts, tokenizer, args.batches)
    size_table(table, tokenizer)


if __name__ == "__main__":
    main()

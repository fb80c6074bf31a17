"""The peers' signals (issue 52): what they cost the build, the memory a worker holds per n-gram
type, and each new strategy's masking cost against random masking and the Hugging Face collators.

    python -m benchmarks.peer_signals [--corpus data/debian-science.jsonl] [--batches 20] [--no-build]

1. The build: `maskstream build` of the corpus (DirectRunner, offline MiniLM), without and with
   `--peer-signals`, each in a fresh process, wall time and the ratio. Then the new stages' own
   work in one process (the formulas' in-process form: n-gram counts and scoring, sentence word
   sets, pair counts and relevances), CPU time, beside the pipeline's floor cost: tokenizing the
   same texts with the HF fast tokenizer (DESIGN.md: whatever else the pipeline does should add less).
2. Memory per n-gram type and per word pair: tracemalloc of the keyed counts of the corpus (a dict of
   tuple -> int, what a Beam worker's combiner or the update's merge holds), bytes per entry.
3. Masking, batch 256 x 128 tokens, 1 CPU thread, real Debian text (benchmarks/masking.py's rows):
   per-sample features to a masked batch. Ours also join the peer signals to each row (the
   loader's `span_ids` and `informativeness`, in its workers): shown apart and included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from benchmarks.masking import BATCH, LENGTH, as_stored, real_sequences, timed
from testing import sequence_dataset as factory

REPO = Path(__file__).resolve().parents[1]


def maskstream(*arguments: str) -> float:
    """Wall seconds of one `maskstream` command in a fresh process."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "maskstream", "--log-level", "WARNING", *arguments], cwd=REPO, check=True,
                   capture_output=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    return time.perf_counter() - started


def build_table(corpus: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        maskstream("stats", "--input", str(corpus), "--output", f"{tmp}/stats")
        maskstream("seeds", "--stats", f"{tmp}/stats", "--output", f"{tmp}/seeds.json")
        common = ("build", "--input", str(corpus), "--stats", f"{tmp}/stats", "--seeds", f"{tmp}/seeds.json")
        plain = maskstream(*common, "--output", f"{tmp}/plain")
        peers = maskstream(*common, "--output", f"{tmp}/peers", "--peer-signals")
    print(f"\n## `maskstream build` of {corpus.name}, DirectRunner, wall time of a fresh process\n")
    print("| build | seconds | vs the build alone |")
    print("| --- | ---: | ---: |")
    print(f"| build | {plain:.1f} | 1.00 |")
    print(f"| build --peer-signals | {peers:.1f} | {peers / plain:.2f} |")


def stage_table(texts: list[str]) -> None:
    from maskstream.pipelines.statistics.peer_formulas import (
        PeerCounts,
        PeerSignalSettings,
        collocation_vocabulary,
        relevance_of_counts,
    )

    tokenizer = factory.tokenizer()
    settings = PeerSignalSettings()

    def cpu(fn) -> float:
        started = time.process_time()
        fn()
        return time.process_time() - started

    tokenize = cpu(lambda: [tokenizer(texts[i : i + 1024])["input_ids"] for i in range(0, len(texts), 1024)])
    counted: dict = {}
    count = cpu(lambda: counted.setdefault("counts", PeerCounts().count(texts)))
    counts = counted["counts"]
    score = cpu(lambda: collocation_vocabulary(counts.ngrams, settings))
    relevance = cpu(lambda: relevance_of_counts(counts.sentences, counts.pairs, counts.total, settings))
    print(f"\n## The new stages' work in one process, {len(texts):,} texts, CPU seconds\n")
    print("| work | seconds | vs tokenizing |")
    print("| --- | ---: | ---: |")
    for name, seconds in (("HF fast tokenizer, batches of 1024 (the floor)", tokenize),
                          ("counts: n-grams (n = 1..5), sentences per word and per pair (PeerCounts)", count),
                          ("collocation scores (pmi_n) and the vocabulary", score),
                          ("relevances (pair PMI, exact sums)", relevance)):
        print(f"| {name} | {seconds:.2f} | {seconds / tokenize:.2f} |")


def memory_table(texts: list[str]) -> None:
    from maskstream.pipelines.statistics.peer_formulas import ngrams, sentence_word_set, split, word_pairs

    def held(make) -> tuple[int, int]:
        tracemalloc.start()
        counts = make()
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return size, len(counts)

    # Split inside the traced call: the counts' keys hold the words' strings, which the split makes.
    ngram_bytes, ngram_types = held(lambda: Counter(g for t in texts for s in split(t)[0] for g in ngrams(s)))
    pair_bytes, pair_types = held(lambda: Counter(p for t in texts for s in split(t)[1]
                                                  for p in word_pairs(sentence_word_set(s))))
    print("\n## Memory of the keyed counts (tracemalloc: the dict, its tuple keys and their strings)\n")
    print("| counts | types | bytes | bytes per type |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| n-grams, n = 1..5 | {ngram_types:,} | {ngram_bytes:,} | {ngram_bytes / ngram_types:.0f} |")
    print(f"| word pairs of sentences | {pair_types:,} | {pair_bytes:,} | {pair_bytes / pair_types:.0f} |")


def masking_table(corpus: Path, batches: int) -> None:
    from transformers import DataCollatorForLanguageModeling

    from maskstream.trainer.collate import collate_sequences
    from maskstream.trainer.masking import MaskingConfig, apply_masking
    from maskstream.trainer.strategies import peer_columns

    _, texts = real_sequences(corpus)
    all_texts = factory.read_texts(corpus)
    rows, vocabulary = factory.rows_and_vocabulary(texts, max_length=LENGTH)
    signals = factory.peer_signals_of(all_texts, vocabulary, ngram_min_count=5)
    tok = factory.tokenizer()
    samples = [as_stored(r, i) for i, r in enumerate(rows[:BATCH])]
    encoded = tok(texts[:BATCH], truncation=True, max_length=LENGTH, return_special_tokens_mask=True,
                  return_offsets_mapping=True)
    plain = [{"input_ids": encoded["input_ids"][i], "special_tokens_mask": encoded["special_tokens_mask"][i]}
             for i in range(BATCH)]
    whole = [{**f, "offset_mapping": encoded["offset_mapping"][i]} for i, f in enumerate(plain)]
    results = []
    for name, flag, features in (("HF plain", False, plain), ("HF whole_word_mask=True", True, whole)):
        collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, whole_word_mask=flag)
        masked = int((collator([dict(f) for f in features])["labels"] != -100).sum())
        results.append((name, timed(lambda c=collator, f=features: c([dict(x) for x in f]), batches), 0.0, masked))

    def joined(names: tuple[str, ...]) -> list[dict]:
        # As the loader joins them: for its window of rows at once (here the batch's), then sliced per row.
        offsets = np.cumsum([0] + [len(s["word_ids"]) for s in samples])
        columns = signals.columns(np.concatenate([s["word_ids"] for s in samples]),
                                  np.concatenate([s["word_index"] for s in samples]), offsets, names)
        return [{**s, **{name: values[a:b] for name, values in columns.items()}}
                for s, a, b in zip(samples, offsets[:-1], offsets[1:], strict=True)]

    config = MaskingConfig.from_tokenizer(tok)
    for strategy in ("random", "whole_word", "difference", "pmi_span", "difference_pmi_span", "informask"):
        names = peer_columns(strategy)  # what the loader joins for this strategy (nothing for the others)
        join_seconds = timed(lambda n=names: joined(n), batches) if names else 0.0
        rows_in = joined(names) if names else samples
        epoch = iter(range(10**9))
        batch = collate_sequences(rows_in, tok.pad_token_id)
        masked = int((apply_masking(batch, strategy, config, seed=0, epoch=0)["labels"] != -100).sum())
        seconds = timed(lambda r=rows_in, s=strategy, e=epoch: apply_masking(
            collate_sequences(r, tok.pad_token_id), s, config, seed=0, epoch=next(e)), batches)
        results.append((strategy, seconds + join_seconds, join_seconds, masked))
    per = {name: seconds for name, seconds, _, _ in results}
    print(f"\n## Masking, batch {BATCH} x {LENGTH} tokens, 1 CPU thread, real Debian text "
          "(per-sample features -> masked batch; ours with the peer-signal join where the strategy reads it)\n")
    print("| method | ms/batch | of which the join, ms | masked/batch | cost vs random | HF plain / this | "
          "HF whole-word / this |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, seconds, join, masked in results:
        print(f"| {name} | {seconds * 1e3:.2f} | {join * 1e3:.2f} | {masked} | {seconds / per['random']:.2f} | "
              f"{per['HF plain'] / seconds:.2f}x | {per['HF whole_word_mask=True'] / seconds:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=REPO / "data" / "debian-science.jsonl")
    parser.add_argument("--batches", type=int, default=20, help="batches per timing round (default: 20)")
    parser.add_argument("--no-build", action="store_true", help="skip the two builds (about a minute)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    texts = [json.loads(line)["text"] for line in args.corpus.read_text(encoding="utf-8").splitlines()]
    if not args.no_build:
        build_table(args.corpus)
    stage_table(texts)
    memory_table(texts)
    masking_table(args.corpus, args.batches)


if __name__ == "__main__":
    main()

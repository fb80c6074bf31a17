"""The vocabulary policy (`--min-word-count`): coverage and the word encoder's time, side by side.

    python -m benchmarks.vocabulary_policy [--corpus data/debian-science.jsonl] [--counts 1 2 3 5 10] [--threads 1] [--rounds 2]

Counts the corpus' words (`collections.Counter` under the shared word normalization, what
`maskstream stats` counts) and tokenizes every document as the build does
(`maskstream.pipelines.dataset.core.sequences.tokenize_documents`: each token's word type). For each threshold N
prints the word types encoded (count >= N), the share of word occurrences and of tokens inside a
word whose word is encoded (the manifest's `word_occurrence_coverage` and `token_coverage`), and
the time of the build's word encoder (`WordEncoder`, batches as the build makes them) on
those types, with its ratio to N = 1 (every type), all in one run (the fastest of --rounds
interleaved timings). Seeds are left out: the 20
seeds a build adds cost the same at every N.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]


def tokens_per_word(texts: list[str], vocabulary: dict[str, int], model: str) -> np.ndarray:
    """Tokens of each word type (by `vocabulary` row) over the corpus, as the build assigns them."""
    from maskstream.pipelines.corpus import Document
    from maskstream.pipelines.dataset.core.sequences import tokenize_documents
    from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer
    from maskstream.pipelines.dataset.steps import vocabulary_index

    tokenizer = load_backend_tokenizer(model)
    lookup = vocabulary_index(list(vocabulary))  # rows: the words' sorted order, as `vocabulary` numbers them
    tokens = np.zeros(len(vocabulary), np.int64)
    for start in range(0, len(texts), 1000):
        documents = [Document(f"doc:{i}", "corpus", t) for i, t in enumerate(texts[start : start + 1000], start)]
        table, _, _ = tokenize_documents(tokenizer, documents, lookup)
        index = table.column("word_index").combine_chunks().flatten().to_numpy()
        tokens += np.bincount(index[index >= 0], minlength=len(vocabulary))
    return tokens


def encoder_timer(model: str, threads: int):
    """A function: word types -> seconds the build's word encoder takes on them (model loaded once)."""
    from maskstream.pipelines.dataset.core.word_encoder import WordEncoder
    from maskstream.pipelines.dataset.driver import DEFAULTS

    settings = WordEncoder(model, threads=threads, device="cpu", dtype="float32", batch_rows=DEFAULTS.embed_batch_size)
    encoder = settings.load()

    def seconds(words: list[str]) -> float:
        batches = settings.batches(words)
        encoder.encode(batches[0])  # warm-up
        started = time.perf_counter()
        for batch in batches:
            encoder.encode(batch)
        return time.perf_counter() - started

    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=REPO_ROOT / "data" / "debian-science.jsonl")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 3, 5, 10])
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the encoder (default: 1)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="timings per threshold, interleaved; the fastest is kept (default: 2)")
    args = parser.parse_args()

    from maskstream.mask_signal.words import words
    from maskstream.models import default_model

    model = default_model()
    texts = [json.loads(line)[args.text_field] for line in args.corpus.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(words(text))
    vocabulary = {w: i for i, w in enumerate(sorted(counts))}
    tf = np.array([counts[w] for w in vocabulary], np.int64)
    tokens = tokens_per_word(texts, vocabulary, model)
    print(f"{args.corpus.name}: {len(texts)} documents, {tf.sum()} word occurrences, {tokens.sum()} tokens in words, "
          f"{len(vocabulary)} word types; encoder {Path(model).name}, float32, {args.threads} thread(s)")
    names, thresholds = list(vocabulary), sorted(set(args.counts) | {1})
    timer = encoder_timer(model, args.threads)
    # Rounds interleave the thresholds and keep each one's fastest: a shared machine's load then
    # slows every threshold alike, not the one that happened to run during a spike.
    seconds = {n: float("inf") for n in thresholds}
    for round_ in range(args.rounds):
        for n in thresholds:
            seconds[n] = min(seconds[n], timer([w for w, c in zip(names, tf, strict=True) if c >= n]))
            print(f"  round {round_ + 1}, N = {n}: {seconds[n]:.1f} s (fastest so far)", flush=True)
    rows, base = [], seconds[1]
    for n in thresholds:
        keep = tf >= n
        rows.append((n, int(keep.sum()), keep.mean(), tf[keep].sum() / tf.sum(), tokens[keep].sum() / tokens.sum(),
                     seconds[n]))
    print("\n| --min-word-count | types encoded | share of types | word occurrences covered | tokens covered "
          "| encoder s | vs N = 1 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, encoded, share, words_covered, tokens_covered, seconds in rows:
        print(f"| {n} | {encoded} | {share:.1%} | {words_covered:.2%} | {tokens_covered:.2%} | {seconds:.1f} "
              f"| {seconds / base:.2f}x |")


if __name__ == "__main__":
    main()

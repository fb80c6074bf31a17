"""Check that a tokenizer's tokens map to the right words before building with it.

Loads MODEL's tokenizer as `maskstream build` does (refusing one without a fast tokenizer,
character offsets or a mask token), tokenizes a sample of the corpus, assigns every token to
its word (`maskstream.mask_signal.alignment`, the build's rule) and, for every word occurrence, decodes the
tokens assigned to it with the tokenizer's own decoder: the occurrence is right when their
letters and digits spell the word as the tokenizer normalizes it (lower-casing, accent
stripping). Prints the fraction right, the tokens across two words and a few wrong examples;
exits 1 when any occurrence is wrong.

Example:
  maskstream check-tokenizer xlm-roberta-base --input data/debian-science.jsonl
"""

from __future__ import annotations

import argparse
import sys

from maskstream.pipelines.dataset.core.tokenizer_facts import check_tokenizer
from maskstream.pipelines.dataset.inspect.check_tokenizer import (
    SHIPPED_SAMPLE,
    read_texts,
    word_decode_report,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="tokenizer name or path (what --model / --tokenizer take)")
    parser.add_argument("--input", default=SHIPPED_SAMPLE, metavar="FILE",
                        help="corpus sample: .jsonl, .txt (a document per line) or .parquet, local or gs:// "
                             "(default: %(default)s)")
    parser.add_argument("--text-field", default="text", help="JSONL field / Parquet column with the text (default: text)")
    parser.add_argument("--documents", type=int, default=2000, help="documents to check, from the start (default: 2000)")
    parser.add_argument("--examples", type=int, default=5, help="wrong occurrences to show (default: 5)")


def run(args: argparse.Namespace) -> int:
    try:
        check_tokenizer(args.model)
        texts = read_texts(args.input, args.text_field, args.documents)
    except (ValueError, FileNotFoundError) as e:
        print(f"maskstream check-tokenizer: error: {e}", file=sys.stderr)
        return 2
    if not texts:
        print(f"maskstream check-tokenizer: error: {args.input} holds no text", file=sys.stderr)
        return 2
    report = word_decode_report(args.model, texts, args.examples)
    print(f"tokenizer            {args.model}")
    print(f"sample               {report['documents']} documents of {args.input}, {report['words']} word occurrences")
    print(f"decode to their word {report['right'] + report['joined']} ({100 * report['fraction_right']:.3f}%), "
          f"of which {report['joined']} in units joined by a token across words")
    print(f"tokens across words  {report['tokens_across_words']}")
    print(f"wrong                {report['wrong']}")
    for example in report["wrong_examples"]:
        print(f"  {example}")
    return 0 if report["wrong"] == 0 else 1

"""Word statistics of a domain corpus (an Apache Beam pipeline).

Reads the corpus (.txt, .jsonl, .parquet; local paths or gs:// globs), counts every word
(mask_signal/words.py) -- tf (occurrences), df (documents) and the number of documents N -- looks
up each word's frequency in general text (the offline wordfreq tables, or a second corpus
given with --general-input), and scores it by TF-ICF (see pipelines/statistics/tf_icf.py). With
--background-input, a background corpus (the broader text the domain is part of) is counted the
same way and each word also gets its background frequency and its background contrast. Writes

  OUTPUT/word_stats-*.parquet   one row per word (maskstream.schemas.tables.WORD_STATS_SCHEMA)
  OUTPUT/summary.json           documents read/accepted/rejected, distinct and total words, N,
                                the corpus fingerprint, the configuration and formula versions
  OUTPUT/rejects-*.jsonl        one {"source", "location", "reason"} per rejected record

Results are written to a temporary folder beside OUTPUT and moved into place only when the
pipeline succeeded with at least one accepted document; a missing input or zero accepted
documents is an error (exit status 2) and leaves OUTPUT untouched.
"""

from __future__ import annotations

import argparse
import sys

from maskstream.pipelines.statistics.stats import (
    DEFAULT_UNSEEN_COUNT,
    REJECTS_PREFIX,
    SUMMARY_NAME,
    WORD_STATS_PREFIX,
    StatsConfig,
    StatsError,
    compute_stats,
)

EXIT_INPUT_ERROR = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", nargs="+", required=True, metavar="PATTERN",
                        help="domain corpus files or globs (.txt, .jsonl, .parquet; local or gs://)")
    parser.add_argument("--output", required=True, metavar="STATS_DIR",
                        help="folder for word_stats-*.parquet, summary.json and rejects-*.jsonl (local or gs://)")
    parser.add_argument("--text-field", default="text",
                        help="JSONL field / Parquet column holding the text (default: text)")
    parser.add_argument("--txt-mode", choices=("line", "file"), default="line",
                        help=".txt files: a document per line or per file (default: line)")
    parser.add_argument("--general-input", nargs="+", default=None, metavar="PATTERN",
                        help="a general-text corpus to take general frequencies from, read like --input "
                             "(default: none, use the offline wordfreq tables)")
    parser.add_argument("--background-input", nargs="+", default=None, metavar="PATTERN",
                        help="a background corpus the domain is contrasted with, read like --input (e.g. all "
                             "package descriptions for the science ones); adds background_frequency and contrast "
                             "columns, which `maskstream seeds` then ranks by (default: none; docs/signal.md)")
    parser.add_argument("--general-language", default="en",
                        help="wordfreq language of the general frequencies (default: en)")
    parser.add_argument("--unseen-count", type=float, default=DEFAULT_UNSEEN_COUNT,
                        help="occurrences assumed for words general text lacks, at the general source's "
                             f"resolution (default: {DEFAULT_UNSEEN_COUNT}; see docs/statistics-and-seeds.md, 'TF-ICF')")


def run(args: argparse.Namespace) -> int:
    try:
        config = StatsConfig(input=args.input, output=args.output, text_field=args.text_field, txt_mode=args.txt_mode,
                             general_input=args.general_input, background_input=args.background_input,
                             general_language=args.general_language, unseen_count=args.unseen_count)
        summary = compute_stats(config, args.beam_args)
    except (FileNotFoundError, ValueError, StatsError) as e:
        print(f"maskstream stats: error: {e}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    if "dry_run" in summary:
        print(summary["dry_run"])
        return 0
    output = config.output.rstrip("/")
    print(f"wrote {output}/{WORD_STATS_PREFIX}-*.parquet, {output}/{SUMMARY_NAME}, {output}/{REJECTS_PREFIX}-*.jsonl")
    print(f"documents read: {summary['documents_read']}, accepted: {summary['documents_accepted']}, "
          f"rejected: {summary['documents_rejected']}")
    print(f"distinct words: {summary['distinct_words']}, total words: {summary['total_words']}")
    return 0

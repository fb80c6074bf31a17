"""Seed words: the top-K words of `maskstream stats` by TF-ICF, after filters.

With statistics computed against a background corpus (`maskstream stats --background-input`),
the words are ranked by their background contrast instead (`--contrast`, schemas/formulas.py):
TF-ICF times the log-lift of the domain over the background, which keeps the words of the domain
and drops those of the kind of text. The report then shows, per seed, its domain, background and
general frequencies and which contrast put it there: `background + general` when it is also among
the top K by TF-ICF alone, `background` when only the background contrast made it a seed.

A word is a candidate unless a filter removes it:
  min-df        it occurs in fewer than --min-df documents (one document's names and typos);
  stop word     it is on the stop-word list (scikit-learn's English list by default);
  non-alphabetic  it holds a digit (version numbers, identifiers);
  too short     it has fewer than --min-length characters.

Writes SEEDS_JSON ({"seeds": [...] best first, "config", "formulas", "source_fingerprint"}); each
seed holds its stats row ("word", "tf", "df", "general_frequency", "tf_icf", and with a background
"background_frequency", "contrast") and, from `seed_provenance`, "rank", "domain_frequency",
"score_name", "score", "tf_icf_rank" and "put_there_by" ("general", "background + general" or
"background"); `maskstream build` copies the file into the dataset version, and `inspect --html`
shows it (files written before these fields existed still read). Beside it, a Markdown report
(SEEDS_report.md: the top 50 words by TF-ICF with their counts and which filter removed which)
and a bar chart of the seeds' scores (SEEDS.png). The stats table has one row per word type
(millions for a large corpus), so it is streamed in record batches (`SeedRanking`): memory holds
the best rows seen so far, not the vocabulary; no Beam pipeline.
"""

from __future__ import annotations

import argparse
import sys

from maskstream.pipelines.statistics.seeds import (
    CONTRASTS,
    DEFAULT_MIN_DF,
    DEFAULT_MIN_LENGTH,
    DEFAULT_TOP_K,
    SeedsConfig,
    write_seeds,
)

EXIT_INPUT_ERROR = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stats", required=True, metavar="STATS_DIR",
                        help="output folder of `maskstream stats` (local or gs://)")
    parser.add_argument("--output", required=True, metavar="SEEDS_JSON",
                        help="where to write seeds.json; the report and chart go beside it")
    parser.add_argument("--contrast", choices=CONTRASTS, default=None,
                        help="rank by TF-ICF against general language, or by the background contrast "
                             "(default: background when the stats have one, else general)")
    add_seed_options(parser)


def add_seed_options(parser: argparse.ArgumentParser) -> None:
    """How many seeds and which filters (shared by `seeds`, `update` and `watch`)."""
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K,
                        help=f"number of seed words (default: {DEFAULT_TOP_K})")
    parser.add_argument("--min-df", type=int, default=DEFAULT_MIN_DF,
                        help=f"minimum number of documents a seed occurs in (default: {DEFAULT_MIN_DF})")
    parser.add_argument("--min-length", type=int, default=DEFAULT_MIN_LENGTH,
                        help=f"minimum characters of a seed (default: {DEFAULT_MIN_LENGTH})")
    parser.add_argument("--stop-words", default="english", metavar="english|none|FILE",
                        help="stop words: 'english' (scikit-learn's list), 'none', or a file with one word "
                             "a line (default: english)")
    parser.add_argument("--allow-non-alphabetic", action="store_true", default=False,
                        help="let words with digits be seeds (default: alphabetic words only)")


def seeds_config(args: argparse.Namespace) -> SeedsConfig:
    """The seed options of `seeds`, `update` and `watch` (add_seed_options), and --contrast where given."""
    return SeedsConfig(top_k=args.top_k, min_df=args.min_df, min_length=args.min_length, stop_words=args.stop_words,
                       alphabetic_only=not args.allow_non_alphabetic, contrast=getattr(args, "contrast", None))


def run(args: argparse.Namespace) -> int:
    try:
        written = write_seeds(args.stats, args.output, seeds_config(args))
    except (FileNotFoundError, ValueError) as e:  # SeedsError is a ValueError
        print(f"maskstream seeds: error: {e}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    if written["warning"]:
        print(f"maskstream seeds: warning: {written['warning']}", file=sys.stderr)
    print(f"wrote {', '.join(written['paths'])}")
    print("seeds: " + " ".join(row["word"] for row in written["seeds"]))
    return 0

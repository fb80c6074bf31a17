"""Stats, seeds and build in one step, reusing what earlier runs cached: a new dataset version.

Counts and tokenizes only the input files that changed since any earlier run into the same
DATASET_ROOT (added or edited files; removed files simply drop out), encodes only the words and
seeds never encoded before, and recomputes everything global from the cached per-file results:
word statistics and TF-ICF, the seeds, nearest-seed similarities, mask probabilities. Writes
DATASET_ROOT/VERSION/ like `maskstream build` (shards, words.parquet, seeds.json, rejects-*.jsonl,
manifest.json last) and moves DATASET_ROOT/latest to it. The cache lives in DATASET_ROOT/_cache/;
`maskstream gc` prunes it with old versions. The first run into an empty root is a full build.

Rows equal those of `maskstream stats` + `seeds` + `build` with the same options in `truncate`
mode; with `--packing pack`, documents are packed within each input file.

Example:
  maskstream update --input 'corpus/*.jsonl' --output out/dataset
"""

from __future__ import annotations

import argparse
import json
import logging

LOG = logging.getLogger("maskstream.update")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", nargs="+", required=True, metavar="PATTERN",
                        help="domain corpus files or globs (.txt, .jsonl, .parquet; local or gs://)")
    parser.add_argument("--output", required=True, metavar="DATASET_ROOT",
                        help="dataset root (local or gs://); the cache lives in DATASET_ROOT/_cache")
    parser.add_argument("--version", default=None,
                        help="version folder name (default: UTC time plus a random suffix); must not exist")
    add_update_options(parser)


def add_update_options(parser: argparse.ArgumentParser) -> None:
    """The options `update` and `watch` share (everything but the input and the output)."""
    from pipelines.dataset.build import add_dataset_options
    from pipelines.statistics import seeds

    parser.add_argument("--text-field", default="text", help="JSONL field / Parquet column with the text (default: text)")
    parser.add_argument("--txt-mode", choices=("line", "file"), default="line",
                        help=".txt files: a document per line or per file (default: line)")
    seeds.add_seed_options(parser)
    add_dataset_options(parser)


def options_from_args(args: argparse.Namespace, inputs: list[str], root: str):
    from pipelines.dataset.build import config_from_args
    from pipelines.dataset.build_steps import BuildConfig
    from pipelines.lifecycle.incremental import UpdateOptions

    build_args = argparse.Namespace(**vars(args), pack_group_size=0,
                                    tokenize_batch_size=BuildConfig.tokenize_batch_size, write_embeddings=False)
    return UpdateOptions(
        inputs=list(inputs), root=root, build=config_from_args(build_args), text_field=args.text_field,
        txt_mode=args.txt_mode, top_k=args.top_k, min_df=args.min_df, min_length=args.min_length,
        stop_words=args.stop_words, alphabetic_only=not args.allow_non_alphabetic,
        version=getattr(args, "version", None), beam_args=list(getattr(args, "beam_args", [])),
    )


def run(args: argparse.Namespace) -> int:
    from pipelines.lifecycle.incremental import update

    logging.getLogger("apache_beam.typehints.native_type_compatibility").setLevel(logging.WARNING)
    try:
        options = options_from_args(args, args.input, args.output)
        report = update(options)
    except (ValueError, FileNotFoundError, FileExistsError, MemoryError) as e:
        LOG.error("%s", e)
        return 2
    print(json.dumps(report, indent=2))
    print(f"dataset version: {report['version']}\ninspect it with: maskstream inspect {args.output}")
    return 0

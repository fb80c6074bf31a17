"""Stats, seeds and build in one step, reusing what earlier runs cached: a new dataset version.

Counts and tokenizes only the input files that changed since any earlier run into the same
DATASET_ROOT (added or edited files; removed files simply drop out), encodes only the words and
seeds never encoded before, and recomputes everything global from the cached per-file results:
word statistics and TF-ICF, the seeds, nearest-seed similarities, mask probabilities. Writes
DATASET_ROOT/VERSION/ like `maskstream build` (shards, words/, seeds.json, rejects-*.jsonl,
manifest.json last) and moves DATASET_ROOT/latest to it. The cache lives in DATASET_ROOT/_cache/;
`maskstream gc` prunes it with old versions. The first run into an empty root is a full build.

Rows equal those of `maskstream stats` + `seeds` + `build` with the same options, in either
packing mode.

Example:
  maskstream update --input 'corpus/*.jsonl' --output out/dataset
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

from maskstream.cli.build import add_dataset_options, build_config, peer_signal_settings, print_signal
from maskstream.cli.seeds import add_seed_options, seeds_config
from maskstream.pipelines.dataset.steps import BuildConfig
from maskstream.pipelines.update.incremental import leased_update
from maskstream.pipelines.update.options import UpdateOptions

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
    parser.add_argument("--text-field", default="text", help="JSONL field / Parquet column with the text (default: text)")
    parser.add_argument("--txt-mode", choices=("line", "file"), default="line",
                        help=".txt files: a document per line or per file (default: line)")
    add_seed_options(parser)
    add_dataset_options(parser)


def update_options(args: argparse.Namespace, inputs: list[str], root: str) -> UpdateOptions:
    """The UpdateOptions of `update`'s and `watch`'s flags: the build's config made directly, with the
    settings an update does not take (it writes no embeddings)."""
    return UpdateOptions(
        inputs=list(inputs), root=root,
        build=build_config(args, tokenize_batch_size=BuildConfig.tokenize_batch_size,
                           write_embeddings=False),
        seeds=seeds_config(args), text_field=args.text_field, txt_mode=args.txt_mode,
        version=getattr(args, "version", None), beam_args=list(getattr(args, "beam_args", [])),
        peer_signals=peer_signal_settings(args),
    )


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc), None where unknown."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started_ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(uptime - started_ticks / os.sysconf("SC_CLK_TCK"), 3)


def run(args: argparse.Namespace) -> int:

    logging.getLogger("apache_beam.typehints.native_type_compatibility").setLevel(logging.WARNING)
    # The fixed costs every update pays, whatever changed (the stages' own are in "seconds").
    fixed = {"start_and_imports": process_age()}
    started = time.perf_counter()
    try:
        options = update_options(args, args.input, args.output)
        fixed["checks"] = round(time.perf_counter() - started, 3)
        report = leased_update(options)
    except (ValueError, FileNotFoundError, FileExistsError, MemoryError) as e:
        LOG.error("%s", e)
        return 2
    report["fixed_seconds"] = {**fixed, "encoder_load": report.pop("encoder_load_seconds")}
    print(json.dumps(report, indent=2))
    print_signal(report["version"])  # as `build` does: `inspect` then points to it instead of repeating it
    print(f"dataset version: {report['version']}\ninspect it with: maskstream inspect {args.output}")
    return 0

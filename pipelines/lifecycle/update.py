"""Stats, seeds and build in one step, reusing what earlier runs cached: a new dataset version.

Counts and tokenizes only the input files that changed since any earlier run into the same
DATASET_ROOT (added or edited files; removed files simply drop out), encodes only the words and
seeds never encoded before, and recomputes everything global from the cached per-file results:
word statistics and TF-ICF, the seeds, nearest-seed similarities, mask probabilities. Writes
DATASET_ROOT/VERSION/ like `maskstream build` (shards, words/, seeds.json, rejects-*.jsonl,
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
import time

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
    from maskstream.pipelines.dataset.build import add_dataset_options
    from maskstream.pipelines.statistics import seeds

    parser.add_argument("--text-field", default="text", help="JSONL field / Parquet column with the text (default: text)")
    parser.add_argument("--txt-mode", choices=("line", "file"), default="line",
                        help=".txt files: a document per line or per file (default: line)")
    seeds.add_seed_options(parser)
    add_dataset_options(parser)


def options_from_args(args: argparse.Namespace, inputs: list[str], root: str):
    from maskstream.pipelines.dataset.build import config_from_args
    from maskstream.pipelines.dataset.build_steps import BuildConfig
    from maskstream.pipelines.lifecycle.incremental import UpdateOptions

    build_args = argparse.Namespace(**vars(args), pack_group_size=0,
                                    tokenize_batch_size=BuildConfig.tokenize_batch_size, write_embeddings=False)
    return UpdateOptions(
        inputs=list(inputs), root=root, build=config_from_args(build_args), text_field=args.text_field,
        txt_mode=args.txt_mode, top_k=args.top_k, min_df=args.min_df, min_length=args.min_length,
        stop_words=args.stop_words, alphabetic_only=not args.allow_non_alphabetic,
        version=getattr(args, "version", None), beam_args=list(getattr(args, "beam_args", [])),
    )


def leased_update(options) -> dict:
    """`incremental.update(options)` holding a lease (schemas/lease.py) on the version it writes, so
    `maskstream gc` leaves the incomplete version, and the cache it fills, alone however long it takes."""
    import dataclasses

    from maskstream.pipelines.dataset.dataset_writer import join, new_version_name
    from maskstream.pipelines.lifecycle.incremental import update
    from maskstream.schemas.lease import VersionLease

    options = dataclasses.replace(options, version=options.version or new_version_name())
    lease = VersionLease(join(options.root, options.version))
    try:
        return update(options)
    finally:
        lease.release()


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc), None where unknown."""
    import os

    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started_ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(uptime - started_ticks / os.sysconf("SC_CLK_TCK"), 3)


def run(args: argparse.Namespace) -> int:
    from maskstream.pipelines.dataset.build import print_signal

    logging.getLogger("apache_beam.typehints.native_type_compatibility").setLevel(logging.WARNING)
    # The fixed costs every update pays, whatever changed (the stages' own are in "seconds").
    fixed = {"start_and_imports": process_age()}
    started = time.perf_counter()
    try:
        options = options_from_args(args, args.input, args.output)
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

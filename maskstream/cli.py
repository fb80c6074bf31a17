"""`maskstream`: one command line, a subcommand per stage.

Each subcommand lives in its own module, which exposes `add_arguments(parser)` and
`run(args) -> int` and imports its heavy dependencies (Beam, torch) only inside `run`,
so `--help` is fast and the trainer's commands never import Beam.

Pipeline subcommands pass every argument they do not know to Beam (`--runner`,
`--project`, `--region`, `--temp_location`, `--direct_num_workers`, ...) as `args.beam_args`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help, passes unknown flags to Beam)
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "train": ("trainer.train", "continued MLM pretraining on a dataset's streamed shards", False),
    "finetune": ("trainer.finetune", "fine-tune a classifier with TMR, evaluate, zero-shot transfer", False),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maskstream",
        description="Difference-Masking data pipelines (Apache Beam) and a streaming MLM trainer (PyTorch).",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text, passes_beam) in COMMANDS.items():
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(
            name,
            help=help_text,
            description=(module.__doc__ or help_text)
            + ("\n\nUnknown flags are passed to Apache Beam (e.g. --runner=DataflowRunner)." if passes_beam else ""),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(_module=module, _passes_beam=passes_beam)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not args._passes_beam:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.beam_args = unknown
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

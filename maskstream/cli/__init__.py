"""`maskstream`: one command line, a subcommand per stage.

Each subcommand is a module of this package (`maskstream.cli.build`, `maskstream.cli.train`, ...):
its help text, `add_arguments(parser)` and `run(args) -> int`, which turns the flags into the
library's config and calls the library (`maskstream.pipelines`, `maskstream.trainer`). No library
module imports this package. Heavy dependencies (Beam, torch) load only when a command runs, so
`--help` is fast and the trainer's commands never import Beam.

Pipeline subcommands pass every argument they do not know to Beam (`--runner`,
`--project`, `--region`, `--temp_location`, `--direct_num_workers`, ...) as `args.beam_args`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from maskstream.pipelines.dataflow_job import is_dry_run
from maskstream.storage.remote_paths import (
    DEFAULT_TIMEOUT_S,
    TIMEOUT_ENV,
    RemotePathError,
    check_reachable,
    remote_urls,
)

# name -> (module, one-line help, passes unknown flags to Beam)
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "stats": ("maskstream.cli.stats", "word statistics and TF-ICF of a domain corpus (Beam)", True),
    "seeds": ("maskstream.cli.seeds", "top-K seed words by TF-ICF, with a report", False),
    "build": ("maskstream.cli.build", "tokenize, score words against the seeds, write a versioned dataset", True),
    "check-tokenizer": ("maskstream.cli.check_tokenizer", "does a tokenizer map its tokens to the right words? (a corpus sample)", False),
    "inspect": ("maskstream.cli.inspect", "summarize and verify a dataset version, plot its mask probabilities", False),
    "update": ("maskstream.cli.update", "stats, seeds and build in one step, redoing only what the corpus changed", True),
    "watch": ("maskstream.cli.watch", "rebuild a dataset whenever a corpus folder or gs:// prefix changes", True),
    "export-map": ("maskstream.cli.export_map", "write a version's mask map, to mask any text at load time (MaskMap)", False),
    "gc": ("maskstream.cli.gc", "remove old dataset versions and cache entries no kept version uses", False),
    "train": ("maskstream.cli.train", "continued MLM pretraining on a dataset's streamed shards", False),
    "finetune": ("maskstream.cli.finetune", "fine-tune a classifier with TMR, evaluate, zero-shot transfer", False),
    "evaluate": ("maskstream.cli.evaluate", "does a masking strategy beat random masking? TAPT + probe on every labeled text", False),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maskstream",
        description="Difference-Masking data pipelines (Apache Beam) and a streaming MLM trainer (PyTorch).",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    parser.add_argument("--remote-timeout", type=float, default=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)),
                        metavar="SECONDS",
                        help=f"seconds to wait for each gs:// bucket the command names to answer before "
                             f"failing (default: {DEFAULT_TIMEOUT_S:g}, or ${TIMEOUT_ENV})")
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


def command_line(command: str, *extra: str, **options: object) -> list[str]:
    """`maskstream COMMAND` arguments built from the command's own option names (argparse dests, which are
    its config's fields), for a program that runs the commands (maskstream evaluate): an option the command
    does not have, or an `extra` flag it does not know, raises here, where that program's tests see it, not
    in a run. True gives a switch, None leaves the option out, a list or tuple gives several values."""
    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    by_name = {action.dest: action for action in parser._actions if action.option_strings}
    known = {flag for action in by_name.values() for flag in action.option_strings}
    unknown = [flag for flag in extra if flag.startswith("--") and flag.split("=", 1)[0] not in known]
    if unknown or set(options) - set(by_name):
        raise ValueError(f"maskstream {command} has no option {unknown or sorted(set(options) - set(by_name))}")
    args = [command]
    for name, value in options.items():
        flag = max(by_name[name].option_strings, key=len)
        if value is None:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, list | tuple):
            args += [flag, *map(str, value)]
        else:
            args += [flag, str(value)]
    return args + list(extra)


def beam_root_chatter(record: logging.LogRecord) -> bool:
    """False for Beam's INFO lines logged on the root logger rather than its own (`logging.info(
    "Missing pipeline option (runner)...")` in apache_beam/pipeline.py), which the level of the
    `apache_beam` logger cannot hold back; a handler filter, so --log-level debug shows them."""
    from_beam = record.name == "root" and f"{os.sep}apache_beam{os.sep}" in record.pathname
    return not from_beam or record.levelno >= logging.WARNING


EXIT_OS_ERROR = 74  # sysexits.h EX_IOERR
EXIT_REMOTE_UNAVAILABLE = 69  # sysexits.h EX_UNAVAILABLE


def _wrapped_by(error: BaseException) -> BaseException | None:
    """The exception `error` wraps: its explicit cause (`raise ... from e`); or the one it was
    raised while handling, when `error` is a Beam runner's re-raise with the step's name
    (`_tagged_with_step`) or itself an OSError (a library re-raising an I/O error as another,
    e.g. Beam's `raise IOError(err)`). Any other exception merely raised while an OSError was
    handled, e.g. in a library's fallback code, wraps nothing: that OSError is not what failed."""
    if error.__cause__ is not None:
        return error.__cause__
    rewrapped = getattr(error, "_tagged_with_step", False) or isinstance(error, OSError)
    return error.__context__ if rewrapped else None


def _os_error_in(error: BaseException) -> OSError | None:
    """The most telling OSError that `error` is or wraps (runners such as Beam's re-raise it wrapped
    in their own, sometimes as a new OSError of the message alone): one naming a file, else one
    with an errno, else any. None when no OSError is what failed."""
    chain: list[OSError] = []
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            chain.append(current)
        current = _wrapped_by(current)
    for telling in (lambda e: e.filename, lambda e: e.errno is not None, lambda e: True):
        found = next((e for e in chain if telling(e)), None)
        if found is not None:
            return found
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not args._passes_beam:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.beam_args = unknown
    if any("DaskRunner" in arg for arg in unknown):
        # Measured by benchmarks/dask_runner.py on Beam 2.77: wrong outputs, not an error.
        parser.error("Beam's DaskRunner runs only a pipeline's last sink and empties tagged outputs, so it would "
                     "write no word table and count every document as rejected (docs/scale.md, 'Other runners'); "
                     "use --direct_num_workers=N --direct_running_mode=multi_processing on one machine, or Dataflow")
    level = getattr(logging, str(args.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Beam logs every type-hint conversion and runner probe at INFO: keep that for --log-level DEBUG.
    logging.getLogger("apache_beam").setLevel(max(level, logging.WARNING) if level > logging.DEBUG else level)
    if level > logging.DEBUG:
        for handler in logging.getLogger().handlers:
            handler.addFilter(beam_root_chatter)
    # gcsfs and google-auth narrate every credential probe; failures reach us as exceptions anyway.
    for chatty in ("gcsfs", "google.auth"):
        logging.getLogger(chatty).setLevel(logging.ERROR if level > logging.DEBUG else level)
    try:
        if args._passes_beam and is_dry_run(args.beam_args):
            logging.getLogger("maskstream").info("dry run: the remote paths are not checked")
        else:
            check_reachable(remote_urls(vars(args).values()), args.remote_timeout)
    except RemotePathError as error:
        logging.getLogger("maskstream").debug("remote path check failed", exc_info=True)
        print(f"maskstream {args.command}: error: {error}", file=sys.stderr)
        return EXIT_REMOTE_UNAVAILABLE
    try:
        return int(args._module.run(args) or 0)
    except Exception as error:  # a full disk, a refused write, a failed read: one line naming the path
        os_error = _os_error_in(error)
        if os_error is None:
            raise
        logging.getLogger("maskstream").debug("%s failed", args.command, exc_info=True)
        if os_error.filename:
            message = f"{os_error.strerror}: {os_error.filename}"
        elif os_error.errno is not None:  # e.g. ENOSPC from a write(): the error does not hold the file
            message = f"{os_error.strerror} (writing under --output {getattr(args, 'output', '?')})"
        else:
            message = str(os_error)
        print(f"maskstream {args.command}: error: {message}", file=sys.stderr)
        return EXIT_OS_ERROR


def run() -> int:
    """The `maskstream` command: `main()`, then the process ends. Python's last cyclic collection
    at exit would walk the millions of objects torch and transformers keep alive (docs/updates.md)
    only to free memory the OS takes back anyway: frozen
    objects are left out of it (finalizers still run)."""
    # here, not at the top: once `maskstream gc` is loaded, `gc` on this package is that command's module
    import gc

    status = main()
    gc.freeze()
    return status


if __name__ == "__main__":
    sys.exit(run())

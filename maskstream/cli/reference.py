"""Write `docs/cli.md`, the command-line reference, from the argparse definitions themselves.

    python -m maskstream.cli.reference            # rewrite docs/cli.md
    python -m maskstream.cli.reference --check    # exit 1 if docs/cli.md is out of date

A test runs the check, so the page cannot drift from the commands.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from maskstream.cli import COMMANDS, build_parser

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
WIDTH = "100"  # argparse wraps to $COLUMNS: fixed, so the page does not depend on the terminal


def render() -> str:
    """The reference page: `maskstream --help`, then each command's `--help`, verbatim."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parts = ["# Command-line reference", "",
                 "Generated from the argparse definitions by `python -m maskstream.cli.reference`; "
                 "do not edit by hand. Back to the [README](../README.md).", "",
                 "## maskstream", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name in COMMANDS:
            parts += [f"## maskstream {name}", "", "```text", subcommands.choices[name].format_help().rstrip(),
                      "```", ""]
        return "\n".join(parts)
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with docs/cli.md instead of writing it")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE} is out of date: run `python -m maskstream.cli.reference`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

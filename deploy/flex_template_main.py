"""Dataflow Flex Template entry point: `maskstream build` with the template's parameters.

Dataflow's launcher runs this file (FLEX_TEMPLATE_PYTHON_PY_FILE in the `dataflow-worker`
image) with every template parameter as `--name=value` (the names of
flex_template_metadata.json) and the job's pipeline options (`--runner`, `--project`,
`--region`, `--temp_location`, `--sdk_container_image`, ...). Template parameter names cannot
hold hyphens, so a parameter whose name, with `_` read as `-`, is an option of `maskstream
build` (`text_field` -> `--text-field`) goes to build; `input` may list several patterns
separated by commas; everything else goes to Beam unchanged.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND = "build"


def build_options() -> set[str]:
    """The option strings `maskstream build` accepts."""
    from maskstream.cli import COMMANDS

    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(COMMANDS[COMMAND][0]).add_arguments(parser)
    return set(parser._option_string_actions)


def to_cli_args(template_args: list[str]) -> list[str]:
    """Template arguments -> `maskstream build ...` arguments (Beam's passed through as given)."""
    known = build_options()
    command, beam = [COMMAND], []
    for arg in template_args:
        name, has_value, value = arg.partition("=")
        flag = name.replace("_", "-")
        if not (arg.startswith("--") and flag in known):
            beam.append(arg)
        elif flag == "--input" and has_value:
            command += [flag, *[p for p in value.split(",") if p]]
        elif has_value:
            command.append(f"{flag}={value}")
        else:
            command.append(flag)
    return command + beam


if __name__ == "__main__":
    from maskstream.cli import main

    sys.exit(main(to_cli_args(sys.argv[1:])))

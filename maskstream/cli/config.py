"""Config dataclasses from parsed command-line arguments."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def config_of(cls: type, args: argparse.Namespace) -> Any:
    """The config dataclass `cls` of parsed arguments (a field per option, same names); a setting its
    `__post_init__` refuses exits with the message."""
    try:
        return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})
    except ValueError as e:
        raise SystemExit(str(e)) from None

"""Config dataclasses from parsed command-line arguments."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def config_fields(cls: type, args: argparse.Namespace, **overrides: Any) -> dict[str, Any]:
    """The fields of config dataclass `cls` from parsed arguments: an option per field, same names;
    `overrides` gives the fields whose option has another name, or no option."""
    return {field.name: overrides[field.name] if field.name in overrides else getattr(args, field.name)
            for field in dataclasses.fields(cls)}


def config_of(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """The config dataclass `cls` of parsed arguments (`config_fields`); a setting its `__post_init__`
    refuses exits with the message."""
    try:
        return cls(**config_fields(cls, args, **overrides))
    except ValueError as e:
        raise SystemExit(str(e)) from None

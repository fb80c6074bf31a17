"""`UpdateOptions`: what `maskstream update` and each rebuild of `watch` are asked to do (their
flags, maskstream/cli/update.py); the build's own settings are a `BuildConfig`."""

from __future__ import annotations

import dataclasses
from typing import Any

from maskstream.pipelines.dataset.build_steps import BuildConfig


@dataclasses.dataclass
class UpdateOptions:
    inputs: list[str]
    root: str
    build: BuildConfig
    text_field: str = "text"
    txt_mode: str = "line"
    top_k: int = 20
    min_df: int = 3
    min_length: int = 3
    stop_words: str = "english"
    alphabetic_only: bool = True
    general_language: str = "en"
    unseen_count: float = 0.5
    version: str | None = None
    beam_args: list[str] = dataclasses.field(default_factory=list)

    def seed_filters(self) -> dict[str, Any]:
        return {"top_k": self.top_k, "min_df": self.min_df, "min_length": self.min_length,
                "stop_words": self.stop_words, "alphabetic_only": self.alphabetic_only}

    def stats_config(self) -> dict[str, Any]:
        """What `maskstream stats` records of its settings (summary.json's "config"), for an update."""
        return {"input": list(self.inputs), "text_field": self.text_field, "txt_mode": self.txt_mode,
                "general_input": [], "general_language": self.general_language, "background_input": [],
                "unseen_count": self.unseen_count}

"""`UpdateOptions`: what `maskstream update` and each rebuild of `watch` are asked to do (their
flags, maskstream/cli/update.py): the seeds a `SeedsConfig`, the build's settings a `BuildConfig`;
the corpus is read and counted as `maskstream stats` does with its defaults (an update takes no
general or background corpus)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from maskstream.pipelines.dataset.steps import BuildConfig
from maskstream.pipelines.statistics.peer_formulas import PeerSignalSettings
from maskstream.pipelines.statistics.seeds import SeedsConfig
from maskstream.pipelines.statistics.stats import StatsConfig

# The seed settings an update passes to its merged statistics and records in the version.
SEED_FILTERS = ("top_k", "min_df", "min_length", "stop_words", "alphabetic_only")


@dataclasses.dataclass
class UpdateOptions:
    inputs: list[str]
    root: str
    build: BuildConfig
    seeds: SeedsConfig = dataclasses.field(default_factory=SeedsConfig)
    text_field: str = StatsConfig.text_field
    txt_mode: str = StatsConfig.txt_mode
    version: str | None = None
    beam_args: list[str] = dataclasses.field(default_factory=list)
    peer_signals: PeerSignalSettings | None = None  # `--peer-signals`: also maintain the peers' signals
    general_language: ClassVar[str] = StatsConfig.general_language
    unseen_count: ClassVar[float] = StatsConfig.unseen_count

    def seed_filters(self) -> dict[str, Any]:
        return {name: getattr(self.seeds, name) for name in SEED_FILTERS}

    def stats_config(self) -> dict[str, Any]:
        """What `maskstream stats` records of its settings (summary.json's "config"), for an update."""
        return {"input": list(self.inputs), "text_field": self.text_field, "txt_mode": self.txt_mode,
                "general_input": [], "general_language": self.general_language, "background_input": [],
                "unseen_count": self.unseen_count}

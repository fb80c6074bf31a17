"""The watch keeps nothing from one rebuild to the next (issue 42): its Python heap after version 60
is within 5 MB of its size after version 30, measured by tracemalloc in the watch's own loop
(benchmarks/watch_memory.py) over a corpus that changes before every check."""

from __future__ import annotations

from pathlib import Path

import pytest

HEAP_GROWTH_LIMIT_MB = 5.0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_watch_heap_stays_flat_from_version_30_to_60(tmp_path: Path, tiny_bert: str) -> None:
    from benchmarks.watch_memory import report, watch_versions

    figures = watch_versions(tmp_path, versions=60, compare=30, model=tiny_bert)
    print(report(figures, 30))
    rows = figures["versions"]
    assert len(rows) == 60
    growth = rows[59]["heap_mb"] - rows[29]["heap_mb"]
    assert growth <= HEAP_GROWTH_LIMIT_MB, report(figures, 30)

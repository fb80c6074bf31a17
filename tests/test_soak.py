"""The soak benchmark (benchmarks/soak.py) for 30 versions: `watch` publishing, `gc --keep 2` with a
3-second grace collecting, and `train --follow-latest` switching, all at once while a script keeps
changing the corpus every 2 s, twice the benchmark's default rate (the watch encodes words with the
trainer's tiny BERT: the MiniLM would only make each rebuild slower). At 4 s the soak was bound by the clock
(about 130 s, issue 62); at 2 s a version comes as fast as a rebuild allows, and changes that land during a
rebuild are published together, so the soak still waits for 30 published versions. Passing: no read error in the trainer, every version's documents read =
written + rejected, the trainer ends on the newest version, and flat RSS."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_watch_gc_and_a_following_trainer_run_together_for_30_versions(tmp_path: Path) -> None:
    from benchmarks import soak

    figures = soak.run_soak(tmp_path, versions=30, change_every=2.0, tiny_encoder=True)
    print(soak.report(figures))
    assert figures["trainer_read_errors"] == 0, figures["error_lines"]
    assert figures["versions_published"] >= 30 and figures["versions_accounted"] == figures["versions_published"]
    assert figures["trainer_on"] == figures["newest"]
    assert figures["passed"], soak.report(figures)

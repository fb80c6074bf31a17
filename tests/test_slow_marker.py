"""The `slow` marker holds: `make test-fast` (`pytest -m "not slow"`) runs no subprocess, no Beam pipeline and
no training. tests/conftest.py refuses them in every test not marked slow, in every run; this checks the refusal."""

from __future__ import annotations

import subprocess
import sys

import apache_beam as beam
import pytest
import transformers

from tests.conftest import SLOW_WORK_DONE, SlowWorkInAFastTest


def test_a_test_not_marked_slow_may_not_start_a_subprocess_run_beam_or_train(request) -> None:
    from maskstream.trainer import finetune, train

    with pytest.raises(SlowWorkInAFastTest, match="test_slow_marker.py::.* starts a subprocess but is not marked"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    with pytest.raises(SlowWorkInAFastTest, match="runs a Beam pipeline"), beam.Pipeline() as pipeline:
        _ = pipeline | beam.Create([1])
    with pytest.raises(SlowWorkInAFastTest, match=r"trains \(maskstream train\)"):
        train.train_step()
    with pytest.raises(SlowWorkInAFastTest, match=r"trains \(maskstream finetune\)"):
        finetune.train_epoch()
    with pytest.raises(SlowWorkInAFastTest, match=r"trains \(transformers.Trainer\)"):
        transformers.Trainer.train(None)
    # Caught by the code under test or not, each is recorded and fails the test; this one takes them back.
    assert len(request.node.stash[SLOW_WORK_DONE]) == 5
    request.node.stash[SLOW_WORK_DONE].clear()


@pytest.mark.slow
def test_a_slow_test_may() -> None:
    assert subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True,
                          check=True).stdout == "42\n"


def test_the_modules_scheduled_first_exist() -> None:
    """tests/conftest.py's LONGEST_MODULES start first under `make test`; a renamed module would silently fall
    back to the end of the run."""
    from tests.conftest import LONGEST_MODULES, REPO_ROOT

    assert [m for m in LONGEST_MODULES if not (REPO_ROOT / m).is_file()] == []
    assert len(set(LONGEST_MODULES)) == len(LONGEST_MODULES)

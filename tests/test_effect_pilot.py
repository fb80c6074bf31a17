"""The pilot's rule (benchmarks/effect/PILOT.md) applied to made-up gains: which cell it chooses."""

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.effect.pilot import GRID, check_frozen, choice


def figures(gains: dict[int, float]) -> dict[int, dict[str, float]]:
    return {c.number: {"gain": gains.get(c.number, 0.0)} for c in GRID}


def test_incomplete_grid_chooses_nothing() -> None:
    found = figures({})
    del found[10]
    assert choice(found).startswith("Incomplete: 9 of 10 cells")


def test_gaining_minilm_cells_within_half_a_point_go_to_the_fewest_passes() -> None:
    # cell 8 (20 passes) is best, cell 1 (5 passes) within 0.5 points of it; the small cells gain more
    gains = {1: 2.6, 2: -1.0, 3: 0.5, 4: 5.0, 6: 7.0, 8: 3.0, 9: 1.2, 10: 2.0}
    assert choice(figures(gains)).startswith("**Chosen (rule 3):** cell 1, learning rate 0.0001, 5 passes")


def test_a_far_better_longer_cell_wins() -> None:
    gains = {1: 1.1, 8: 3.0}
    assert choice(figures(gains)).startswith("**Chosen (rule 3):** cell 8, learning rate 0.0001, 20 passes")


def test_no_minilm_cell_gaining_is_said_and_the_best_point_estimate_taken() -> None:
    gains = {1: -3.0, 2: 0.9, 3: -0.2, 6: 6.4, 8: 0.2, 9: -7.5, 10: 0.99}
    text = choice(figures(gains))
    assert text.startswith("**Chosen (rule 4):** cell 10, learning rate 3e-05, 20 passes")
    assert "the control failed at every MiniLM setting tried" in text


def test_this_checkout_runs_its_own_packages() -> None:
    check_frozen()  # raises SystemExit when a package loads from another checkout


def test_the_second_task_is_the_pinned_file_and_its_rule_holds(tmp_path: Path) -> None:
    """The committed docstring task is the pinned bytes; its rule, on a made-up standard library, keeps a
    text once per package, drops one found in two packages and takes the largest packages."""
    from benchmarks.effect import second_corpus
    from benchmarks.effect.configs import SECOND_TASK

    repo = Path(__file__).resolve().parents[1]
    data = (repo / SECOND_TASK["path"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == SECOND_TASK["sha256"]
    rows = [json.loads(line) for line in data.decode("utf-8").splitlines()]
    assert len(rows) == 2439 and len({r["text"] for r in rows}) == len(rows)
    assert len(Counter(r[SECOND_TASK["label_field"]] for r in rows)) == second_corpus.PACKAGES

    words = "one two three four five six seven eight nine ten"
    stdlib = tmp_path / "lib"
    for package, bodies in {"big": [f"{words} {i}" for i in range(3)] + [f"{words} 0", f"{words} shared"],
                            "mid": [f"{words} m{i}" for i in range(2)] + [f"{words} shared"],
                            "test": [f"{words} t{i}" for i in range(9)], "small": [f"{words} s"]}.items():
        (stdlib / package).mkdir(parents=True)
        functions = "".join(f'def f{i}():\n    """{body}"""\n' for i, body in enumerate(bodies))
        (stdlib / package / "module.py").write_text(f'"""too short"""\n{functions}')
    (stdlib / "single.py").write_text(f'"""{words} single"""\n')
    found = second_corpus.docstrings(stdlib)
    assert {r["package"] for r in found} == {"big", "mid", "small"}  # no test suite, no single-file module
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(second_corpus, "PACKAGES", 2)
    task = second_corpus.task(found)
    monkeypatch.undo()
    assert [(r["package"], r["text"].removeprefix(words + " ")) for r in task] == [
        ("big", "0"), ("big", "1"), ("big", "2"), ("mid", "m0"), ("mid", "m1")]


@pytest.mark.slow  # parses the whole standard library: about 10 s
@pytest.mark.skipif(sys.version_info[:3] != (3, 11, 7), reason="the task was made from CPython 3.11.7's library")
def test_the_second_task_is_made_again_byte_for_byte(tmp_path: Path) -> None:
    from benchmarks.effect import second_corpus
    from benchmarks.effect.configs import SECOND_TASK

    out = tmp_path / "task.jsonl"
    second_corpus.main([str(out)])
    assert hashlib.sha256(out.read_bytes()).hexdigest() == SECOND_TASK["sha256"]

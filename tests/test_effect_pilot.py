"""The pilot's rule (benchmarks/effect/PILOT.md) applied to made-up gains: which cell it chooses."""

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

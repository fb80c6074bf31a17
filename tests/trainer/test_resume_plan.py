"""A run planned in epochs ends where its epochs end, on any layout (issue 53).

Hypothesis draws the rows of a version, the ranks, workers and batch sizes before and after one or
two resumes, the resume points anywhere in the run, the epochs and the gradient accumulation. The
real loader (`StreamingSequenceDataset` and `build_dataloader`, every rank in this process, as
`maskstream train` takes its batches) deals the rows, and the plan (`maskstream.trainer.plan`) says
how many steps each layout trains. Checked for each case: every sample of each epoch is trained
once, but for the remainder policy's repeats (at most ranks - 1 per layout that dealt part of the
epoch), nothing past the last epoch but what one step's accumulation takes, the samples dealt are
the samples planned, and the learning rate ends where the uninterrupted run's ends."""

from __future__ import annotations

import collections
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.loader import build_dataloader
from maskstream.trainer.plan import Plan, Position, fresh_plan, learning_rate_factor, replan
from tests.fixtures.sequence_dataset import read_texts, sequence_rows, write_dataset

ROWS = (61, 150, 203)  # prime or odd: no layout below divides them
SEED = 5


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict[int, str]:
    made = {}
    for rows in ROWS:
        root = tmp_path_factory.mktemp(f"plan-{rows}")
        write_dataset(str(root), sequence_rows(read_texts(limit=rows), max_length=24), shards=3, row_group_size=16)
        made[rows] = str(root)
    return made


@dataclasses.dataclass
class Layout:
    ranks: int
    workers: int
    batch: int


class Ranks:
    """Every rank of a layout, each a dataset and its loader, dealing as the training loop takes."""

    def __init__(self, url: str, layout: Layout, states: list[dict] | None = None):
        self.layout = layout
        self.datasets, self.streams = [], []
        for rank in range(layout.ranks):
            dataset = StreamingSequenceDataset(url, seed=SEED, rank=rank, world_size=layout.ranks)
            loader = build_dataloader(dataset, batch_size=layout.batch, num_workers=layout.workers, strategy=None,
                                      masking=None)
            if states is not None:  # the same world size: each its own; else any rank's (they agree)
                dataset.load_state_dict(states[rank] if len(states) == layout.ranks else states[0])
            self.datasets.append(dataset)
            self.streams.append(self._deal(dataset, loader))

    @staticmethod
    def _deal(dataset, loader):
        while True:  # a finished epoch moves on to the next, as TrainingData.batches does
            for batch in loader:
                yield dataset.epoch, batch["sample_index"].tolist()

    def position(self) -> Position:
        return Position.of(self.datasets[0], self.layout.batch, self.layout.ranks)

    def train(self, steps: int, accumulation: int, trained: list[tuple[int, int]]) -> int:
        """Takes `steps` steps' batches on every rank; returns the samples dealt."""
        dealt = 0
        for _ in range(steps * accumulation):
            for stream in self.streams:
                epoch, indices = next(stream)
                trained.extend((epoch, i) for i in indices)
                dealt += len(indices)
        return dealt

    def states(self) -> list[dict]:
        return [dataset.state_dict() for dataset in self.datasets]


def check_epochs(trained: list[tuple[int, int]], rows: int, epochs: int, layouts: list[Layout], spill: int) -> None:
    for epoch in range(epochs):
        counts = collections.Counter(i for e, i in trained if e == epoch)
        assert set(counts) == set(range(rows)), f"epoch {epoch} skipped {sorted(set(range(rows)) - set(counts))}"
        assert sum(c - 1 for c in counts.values()) <= sum(layout.ranks - 1 for layout in layouts)
    assert sum(1 for e, _ in trained if e >= epochs) <= spill


layouts = st.builds(Layout, ranks=st.integers(1, 3), workers=st.sampled_from([0, 0, 1, 2]),
                    batch=st.integers(3, 11))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.sampled_from(ROWS), epochs=st.integers(1, 2), accumulation=st.integers(1, 2),
       runs=st.lists(layouts, min_size=2, max_size=3), cuts=st.lists(st.floats(0.02, 0.98), min_size=2, max_size=2))
def test_a_run_planned_in_epochs_finishes_them_on_any_layout(versions, rows, epochs, accumulation, runs, cuts) -> None:
    url = versions[rows]
    # The uninterrupted run, on the first layout.
    whole = Ranks(url, runs[0])
    plan = fresh_plan(whole.position(), epochs=epochs, max_steps=0, grad_accumulation=accumulation,
                      warmup_ratio=0.1)
    trained: list[tuple[int, int]] = []
    assert whole.train(plan.total_steps, accumulation, trained) == plan.total_samples
    spill = (accumulation - 1) * max(r.ranks * r.batch for r in runs)
    check_epochs(trained, rows, epochs, runs[:1], spill)
    assert learning_rate_factor(plan.total_samples, plan) == 0.0

    # The same run stopped at the cuts (steps into the run) and resumed on the next layouts.
    ranks, step, samples, trained = Ranks(url, runs[0]), 0, 0, []
    current: Plan = plan
    for cut, layout in zip(sorted(cuts), runs[1:], strict=False):
        stop = max(step + 1, round(cut * current.total_steps))
        if stop >= current.total_steps:
            break
        samples += ranks.train(stop - step, accumulation, trained)
        step, states = stop, ranks.states()
        ranks = Ranks(url, layout, states)
        current = replan(current, step, samples, ranks.position(), epochs=epochs, grad_accumulation=accumulation)
    samples += ranks.train(current.total_steps - step, accumulation, trained)
    assert samples == current.total_samples  # the plan counted what the loader dealt
    check_epochs(trained, rows, epochs, runs, spill)
    assert learning_rate_factor(samples, current) == learning_rate_factor(plan.total_samples, plan) == 0.0


def test_the_issues_case_finishes_the_epoch() -> None:
    """1,377 rows, 2 ranks x batch 8, stopped at step 84 and resumed on 1 rank: 34 samples are left
    of the epoch; the old plan's 3 steps covered 24 of them, the new plan's 5 cover all 34."""
    before = Position(epoch=0, rows_left=689 - 84 * 8, batches_left=87 - 84, rows_per_epoch=689, batch_size=8,
                      world_size=2)
    plan = fresh_plan(Position(0, 689, 87, 689, 8, 2), epochs=1, max_steps=0, grad_accumulation=1, warmup_ratio=0.0)
    assert (plan.total_steps, plan.total_samples) == (87, 1378)
    samples_done = 84 * 8 * 2
    assert plan.total_samples - samples_done == before.samples_of(3) == 34
    after = Position(epoch=0, rows_left=34, batches_left=5, rows_per_epoch=1377, batch_size=8, world_size=1)
    resumed = replan(plan, 84, samples_done, after, epochs=1, grad_accumulation=1)
    assert (resumed.total_steps, resumed.total_samples - samples_done) == (89, 34)

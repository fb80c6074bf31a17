"""A run planned in epochs ends where its epochs end, on any layout (issue 53).

Hypothesis draws the rows of a version, the ranks, workers and batch sizes before and after one or
two resumes, the resume points anywhere in the run, the epochs and the gradient accumulation. The
real loader (`StreamingSequenceDataset` and `build_dataloader`, every rank in this process, as
`maskstream train` takes its batches) deals the rows, and the plan (`maskstream.trainer.plan`) says
how many steps each layout trains. Checked for each case: every sample of each epoch is trained
once, but for the remainder policy's repeats (at most ranks - 1 per layout that dealt part of the
epoch), nothing past the last epoch but what one step's accumulation takes, the samples dealt are
the samples planned, and the learning rate ends where the uninterrupted run's ends. The same for
a 0.8/0.2 mixture of the version and general text, whose epochs are the domain's."""

from __future__ import annotations

import collections
import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.loader import build_dataloader
from maskstream.trainer.mixture import build_mixture
from maskstream.trainer.plan import EpochProgress, Plan, fresh_plan, learning_rate_factor, replan
from testing.sequence_dataset import read_texts, sequence_rows, tokenizer, write_dataset

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


@pytest.fixture(scope="module")
def general_text(tmp_path_factory) -> str:
    """70 records of general text (descriptions the versions do not hold): the 0.2 of a mixture."""
    path = tmp_path_factory.mktemp("general") / "general.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in read_texts(limit=max(ROWS) + 70)[max(ROWS):]))
    return str(path)


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

    def position(self) -> EpochProgress:
        return EpochProgress.of(self.datasets[0], self.layout.batch, self.layout.ranks)

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
    before = EpochProgress(epoch=0, rows_left=689 - 84 * 8, batches_left=87 - 84, rows_per_epoch=689, batch_size=8,
                      world_size=2)
    plan = fresh_plan(EpochProgress(0, 689, 87, 689, 8, 2), epochs=1, max_steps=0, grad_accumulation=1, warmup_ratio=0.0)
    assert (plan.total_steps, plan.total_samples) == (87, 1378)
    samples_done = 84 * 8 * 2
    assert plan.total_samples - samples_done == before.samples_of(3) == 34
    after = EpochProgress(epoch=0, rows_left=34, batches_left=5, rows_per_epoch=1377, batch_size=8, world_size=1)
    resumed = replan(plan, 84, samples_done, after, epochs=1, grad_accumulation=1)
    assert (resumed.total_steps, resumed.total_samples - samples_done) == (89, 34)


class MixtureRanks(Ranks):
    """Every rank of a 0.8/0.2 mixture of the version and general text, as `--mix TEXT:0.2` trains."""

    def __init__(self, url: str, text: str, layout: Layout, states: list[dict] | None = None):
        self.layout, self.mixtures = layout, []
        for rank in range(layout.ranks):
            domain = StreamingSequenceDataset(url, seed=SEED, rank=rank, world_size=layout.ranks)
            mixture = build_mixture(domain, [f"{text}:0.2"], tokenizer(), strategy="random", seed=SEED,
                                    batch_size=layout.batch, num_workers=layout.workers)
            if states is not None:
                mixture.load_state_dict(states)
            self.mixtures.append(mixture)

    def position(self) -> EpochProgress:
        mixture = self.mixtures[0]
        epoch, rows_left, rows_per_epoch = mixture.domain_position()
        return EpochProgress(epoch, rows_left, math.ceil(rows_left / self.layout.batch), rows_per_epoch, self.layout.batch,
                        self.layout.ranks, domain_rows=mixture.domain_rows, samples_done=mixture.samples)

    def train(self, steps: int, accumulation: int, trained: list[tuple[int, int]]) -> int:
        """Takes `steps` steps' batches on every rank, recording the domain's rows; returns the samples dealt."""
        dealt = 0
        for _ in range(steps * accumulation):
            for mixture in self.mixtures:
                batch = mixture.next_batch()
                trained.extend((int(e), int(i)) for s, e, i in zip(batch["source"], batch["epoch"],
                                                                   batch["sample_index"], strict=True) if s == 0)
                dealt += len(batch["source"])
        return dealt

    def states(self) -> list[dict]:
        return [mixture.state_dict() for mixture in self.mixtures]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.sampled_from(ROWS[:2]), accumulation=st.integers(1, 2),
       runs=st.lists(st.builds(Layout, ranks=st.integers(1, 3), workers=st.just(0), batch=st.integers(3, 11)),
                     min_size=2, max_size=2),
       cut=st.floats(0.05, 0.95))
# hypothesis's find: resumed on the same 3 ranks, whose domain rows left differ (3, 10 and 2)
@example(rows=150, accumulation=1, runs=[Layout(ranks=3, workers=0, batch=8)] * 2, cut=0.75)
def test_a_mixture_planned_in_epochs_finishes_its_domains_on_any_layout(versions, general_text, rows, accumulation,
                                                                      runs, cut) -> None:
    """--epochs 1 of a 0.8/0.2 mixture, resumed once (on another layout or the same): every domain row
    of epoch 0 is trained (the remainder's repeats aside), and only what the ranks that were ahead took
    of epoch 1 past it (each rank takes its own share: up to a step's accumulation and a batch more per
    rank)."""
    url = versions[rows]
    first = MixtureRanks(url, general_text, runs[0])
    plan = fresh_plan(first.position(), epochs=1, max_steps=0, grad_accumulation=accumulation, warmup_ratio=0.1)
    step = max(1, round(cut * plan.total_steps))
    trained: list[tuple[int, int]] = []
    samples = first.train(min(step, plan.total_steps), accumulation, trained)
    current = plan
    if step < plan.total_steps:
        resumed = MixtureRanks(url, general_text, runs[1], first.states())
        # As `plan_run`: the same ranks and batch size keep the plan. Resumed exactly, each rank has
        # its own domain rows left (its own draw), which rank 0's position does not tell.
        if (runs[1].ranks, runs[1].batch) != (runs[0].ranks, runs[0].batch):
            current = replan(plan, step, samples, resumed.position(), epochs=1, grad_accumulation=accumulation)
        samples += resumed.train(current.total_steps - step, accumulation, trained)
    assert samples == current.total_samples
    spill = sum(r.ranks * r.batch * (accumulation + 1) for r in runs)
    check_epochs(trained, rows, 1, runs, spill)

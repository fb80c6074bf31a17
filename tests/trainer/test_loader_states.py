"""Loader states written by an earlier maskstream still resume: a dataset's and a mixture's states as
checkpoints held them at commit a438217 (before the loader's position became a typed state,
maskstream.trainer.position), and the rows each resumed loader then read, recorded by that commit.

Each case loads the recorded states into today's loaders and checks that they read the recorded rows
next: on the saved layout (exactly) and on another (elastically). A change that alters which rows a
resume reads on purpose records the new rows in the same commit and says why:

    MASKSTREAM_RECORD_LOADER_STATES=1 python -m pytest tests/trainer/test_loader_states.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.loader import build_dataloader
from maskstream.trainer.mixture import DatasetSource, Mixture
from maskstream.trainer.text_source import TextSource
from testing import sequence_dataset as factory

RECORDED = Path(__file__).with_name("recorded_loader_states.json")
RECORD = os.environ.get("MASKSTREAM_RECORD_LOADER_STATES") == "1"
TEXT_URL = "TEXT_SOURCE_URL"  # the text source's path in a recorded state (a temporary folder's)


@pytest.fixture(scope="module")
def recorded() -> dict:
    """The recorded cases; when recording, those this run records replace theirs (a -k run keeps the rest)."""
    return json.loads(RECORDED.read_text()) if RECORDED.exists() else {}


@pytest.fixture(scope="module", autouse=True)
def record_at_the_end(recorded):
    yield
    if RECORD:
        RECORDED.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")


def dataset_rows(root: str, states: list[dict] | None, *, world_size: int, num_workers: int, batch_size: int,
                 steps: int | None = None) -> tuple[list[list[int]], list[dict]]:
    """Each rank's sample indices over `steps` batches (the rest of the epoch when None) after loading
    its state of `states` (every rank's; any rank's on another world size), and each rank's state then."""
    rows, ends = [], []
    for rank in range(world_size):
        ds = StreamingSequenceDataset(root, rank=rank, world_size=world_size, shuffle_buffer=64)
        loader = build_dataloader(ds, batch_size=batch_size, num_workers=num_workers, strategy=None, masking=None)
        if states is not None:
            ds.load_state_dict(states[rank] if len(states) == world_size else states[0])
        taken = []
        for step, batch in enumerate(loader, start=1):
            taken += batch["sample_index"].tolist()
            if step == steps:
                break
        rows.append(taken)
        ends.append(json.loads(json.dumps(ds.state_dict())))  # as a checkpoint holds it
    return rows, ends


# The saved run: ranks x workers x batch and steps (a second tuple: an elastic resume in between, so
# that the saved state holds a segment); the resumes read the rest of the epoch on each layout.
DATASET_CASES = {
    "2 ranks x 2 workers, mid epoch": ([((2, 2, 8), 7)], [(2, 2, 8), (1, 0, 12), (3, 1, 8)]),
    "after an elastic resume (a segment)": ([((2, 0, 8), 5), ((1, 0, 12), 6)], [(1, 0, 12), (4, 0, 8)]),
}


@pytest.mark.parametrize("case", list(DATASET_CASES))
def test_a_recorded_dataset_state_resumes_to_the_recorded_rows(case, local_dataset, recorded):
    runs, resumes = DATASET_CASES[case]
    if RECORD:
        states = None
        for (ranks, workers, batch), steps in runs:
            _, states = dataset_rows(local_dataset, states, world_size=ranks, num_workers=workers,
                                     batch_size=batch, steps=steps)
        recorded[case] = {"states": states, "rows": {}}
    states = recorded[case]["states"]
    for ranks, workers, batch in resumes:
        rows, _ = dataset_rows(local_dataset, states, world_size=ranks, num_workers=workers, batch_size=batch)
        key = f"{ranks}x{workers}x{batch}"
        if RECORD:
            recorded[case]["rows"][key] = rows
        assert rows == recorded[case]["rows"][key], key


def mixture_of(local_dataset: str, text_path: Path, *, rank: int, world_size: int, batch_size: int,
               workers: int) -> Mixture:
    """Rank `rank` of a 0.8/0.2 mixture of the 400-row domain and 300 text records."""
    dataset = StreamingSequenceDataset(local_dataset, seed=3, shuffle_buffer=64, rank=rank, world_size=world_size)
    loader = build_dataloader(dataset, batch_size=batch_size, num_workers=workers, strategy=None, masking=None,
                              collate=False)
    text = TextSource(str(text_path), factory.tokenizer(), 128, batch_size=batch_size, rank=rank,
                      world_size=world_size)
    return Mixture([DatasetSource(dataset, loader), text], [0.8, 0.2], ["difference", "random"], seed=3,
                   batch_size=batch_size, rank=rank, world_size=world_size,
                   pad_token_id=dataset.manifest.tokenizer["pad_token_id"])


def mixture_rows(batch) -> list[list[int]]:
    return [list(row) for row in zip(batch["source"].tolist(), batch["epoch"].tolist(),
                                     batch["sample_index"].tolist(), strict=True)]


def test_a_recorded_mixture_state_resumes_to_the_recorded_rows(local_dataset, tmp_path, recorded):
    """States of 2 ranks x 2 workers that resumed 3 ranks elastically (each of those in its own epoch
    of each source) and took a step of 16: they hold segments of later epochs (`ahead`). Resumed on
    the same layout and on 1 rank."""
    text_path = tmp_path / "general.jsonl"
    text_path.write_text("".join(json.dumps({"text": t}) + "\n" for t in factory.read_texts(limit=300)))
    if RECORD:
        states = None
        for ranks, workers, steps in ((3, 0, 31), (2, 2, 1)):
            saved = [mixture_of(local_dataset, text_path, rank=r, world_size=ranks, batch_size=16, workers=workers)
                     for r in range(ranks)]
            for mixture in saved:
                if states is not None:
                    mixture.load_state_dict(states)
                for _ in range(steps):
                    mixture.next_batch()
            states = json.loads(json.dumps([m.state_dict() for m in saved]))
        recorded["mixture"] = {"states": json.loads(json.dumps(states).replace(str(text_path), TEXT_URL)),
                               "rows": {}}
    states = json.loads(json.dumps(recorded["mixture"]["states"]).replace(TEXT_URL, str(text_path)))
    assert any(source["state"]["ahead"] for s in states for source in s["sources"])
    for ranks, workers, steps in ((2, 2, 8), (1, 0, 24)):
        resumed = [mixture_of(local_dataset, text_path, rank=r, world_size=ranks, batch_size=16, workers=workers)
                   for r in range(ranks)]
        for mixture in resumed:
            mixture.load_state_dict(states)
        rows = [[mixture_rows(mixture.next_batch()) for _ in range(steps)] for mixture in resumed]
        key = f"{ranks}x{workers}x16"
        if RECORD:
            recorded["mixture"]["rows"][key] = rows
        assert rows == recorded["mixture"]["rows"][key], key


def test_a_state_written_before_elastic_resumes_reads_as_one_without_segments(local_dataset, recorded):
    """States of releases before elastic resumes lack `segments` and `ahead`: none of either."""
    case = recorded["2 ranks x 2 workers, mid epoch"]
    older = [{k: v for k, v in state.items() if k not in ("segments", "ahead")} for state in case["states"]]
    rows, _ = dataset_rows(local_dataset, older, world_size=2, num_workers=2, batch_size=8)
    assert rows == case["rows"]["2x2x8"]

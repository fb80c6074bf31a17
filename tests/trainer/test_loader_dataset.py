"""The streaming dataset and its DataLoader: rank x worker split, remainder policy, shuffling,
exact resume, checksums, schema versions and gs://."""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maskstream.schemas.manifest import ManifestError
from maskstream.schemas.tables import SEQUENCE_SCHEMA
from maskstream.trainer.dataset import ChecksumMismatch, RankPlan, StreamingSequenceDataset
from maskstream.trainer.held_out import held_out
from maskstream.trainer.loader import build_dataloader, masked_positions
from maskstream.trainer.masking import MaskingConfig, apply_masking
from maskstream.trainer.position import Layout
from testing import sequence_dataset as factory


def epoch_indices(dataset_root, *, world_size, num_workers, batch_size=16, seed=0, epoch=0, **kwargs):
    """Sample indices each rank yields in `epoch` (ranks simulated as separate datasets)."""
    per_rank = []
    for rank in range(world_size):
        ds = StreamingSequenceDataset(dataset_root, seed=seed, rank=rank, world_size=world_size, **kwargs)
        ds.set_epoch(epoch)
        loader = build_dataloader(ds, batch_size=batch_size, num_workers=num_workers, strategy=None, masking=None)
        batches = [b["sample_index"].tolist() for b in loader]
        assert len(batches) == ds.steps_per_epoch(batch_size)
        per_rank.append([i for b in batches for i in b])
    return per_rank


def test_two_ranks_two_workers_read_every_row_exactly_once(local_dataset):
    per_rank = epoch_indices(local_dataset, world_size=2, num_workers=2, shuffle_buffer=64)
    assert [len(r) for r in per_rank] == [200, 200]
    assert collections.Counter(per_rank[0] + per_rank[1]) == collections.Counter(range(400))
    # A different epoch is another order, the same seed the same order.
    again = epoch_indices(local_dataset, world_size=2, num_workers=2, shuffle_buffer=64)
    other = epoch_indices(local_dataset, world_size=2, num_workers=2, shuffle_buffer=64, epoch=1)
    assert again == per_rank and other != per_rank
    assert sorted(other[0] + other[1]) == list(range(400))
    assert per_rank[0] != sorted(per_rank[0])  # shuffled


def test_one_worker_and_two_workers_read_the_same_rows(local_dataset):
    one = epoch_indices(local_dataset, world_size=2, num_workers=0, shuffle_buffer=64)
    two = epoch_indices(local_dataset, world_size=2, num_workers=2, shuffle_buffer=64)
    assert [sorted(r) for r in one] == [sorted(r) for r in two]


def test_remainder_is_padded_from_the_epoch_start(odd_dataset):
    """101 rows on 2 ranks: both read 51 rows (same step count); one row is read twice."""
    per_rank = epoch_indices(odd_dataset, world_size=2, num_workers=2, batch_size=8, shuffle_buffer=16)
    assert [len(r) for r in per_rank] == [51, 51]
    counts = collections.Counter(per_rank[0] + per_rank[1])
    assert set(counts) == set(range(101))
    assert sorted(counts.values()) == [1] * 100 + [2]
    unshuffled = epoch_indices(odd_dataset, world_size=2, num_workers=0, batch_size=8, shuffle=False)
    assert unshuffled[0] == list(range(51)) and unshuffled[1] == list(range(51, 101)) + [0]


@pytest.mark.parametrize("one_row_group_per_shard", [False, True])
def test_rows_are_the_stored_rows(local_dataset, debian_rows, tmp_path, monkeypatch, one_row_group_per_shard):
    root = local_dataset
    if one_row_group_per_shard:  # windows start inside row groups decoded 7 rows at a time
        root = str(tmp_path / "big-groups")
        factory.write_dataset(root, debian_rows, shards=2, row_group_size=1000)
        monkeypatch.setattr("maskstream.trainer.dataset.READ_BATCH_ROWS", 7)
    ds = StreamingSequenceDataset(root, shuffle_buffer=50)
    assert len(ds.blocks) == (2 if one_row_group_per_shard else 12)
    seen = []
    for sample in ds:
        seen.append(sample["sample_index"])
        row = debian_rows[sample["sample_index"]]
        for name in ("input_ids", "word_ids", "word_index", "special_tokens_mask", "mask_probability"):
            assert sample[name].tolist() == pytest.approx(list(row[name])), name
    assert sorted(seen) == list(range(400))


@pytest.mark.parametrize("num_workers,stop_after", [(0, 11), (2, 11), (2, 24), (2, 25)])
def test_resume_mid_epoch_reproduces_the_following_batches(local_dataset, num_workers, stop_after):
    """Stop after `stop_after` of 25 steps (11: mid-window; 24: one worker exhausted; 25: the end
    of the epoch), save, resume in a new dataset and loader: the rest of epochs 0 and 1 match."""
    def loader_for(ds):
        config = MaskingConfig.from_manifest(ds.manifest)
        return build_dataloader(ds, batch_size=16, num_workers=num_workers, strategy="difference",
                                masking=config, seed=7)

    ds = StreamingSequenceDataset(local_dataset, seed=7, shuffle_buffer=64)
    loader = loader_for(ds)
    uninterrupted = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        uninterrupted += [(epoch, b["sample_index"], b["input_ids"], b["labels"]) for b in loader]
    steps = ds.steps_per_epoch(16)
    assert len(uninterrupted) == 2 * steps == 50

    ds = StreamingSequenceDataset(local_dataset, seed=7, shuffle_buffer=64)
    loader = loader_for(ds)
    for step, _ in enumerate(loader):
        if step + 1 == stop_after:
            break
    state = json.loads(json.dumps(ds.state_dict()))  # what a checkpoint stores
    assert state["samples_consumed"] == stop_after * 16 and state["epoch"] == 0

    resumed = StreamingSequenceDataset(local_dataset, seed=7, shuffle_buffer=64)
    loader = loader_for(resumed)
    resumed.load_state_dict(state)
    replay = []
    for epoch in range(resumed.epoch, 2):
        resumed.set_epoch(epoch)  # keeps the position in the resumed epoch
        replay += [(epoch, b["sample_index"], b["input_ids"], b["labels"]) for b in loader]
    expected = uninterrupted[stop_after:]
    assert len(replay) == len(expected)
    for got, want in zip(replay, expected, strict=True):
        assert got[0] == want[0]
        for g, w in zip(got[1:], want[1:], strict=True):
            assert torch.equal(g, w)


def test_resume_after_a_short_batch_in_mid_epoch(odd_dataset):
    """3 workers, rank 1 of 2 (51 rows), batch 8: the short batch of the last window is the 3rd of
    the epoch. Resuming at every step reproduces the rest of epochs 0 and 1."""
    def make():
        ds = StreamingSequenceDataset(odd_dataset, seed=5, shuffle_buffer=20, rank=1, world_size=2)
        return ds, build_dataloader(ds, batch_size=8, num_workers=3, strategy=None, masking=None)

    ds, loader = make()
    full = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        full += [b["sample_index"].tolist() for b in loader]
    assert len(full[2]) == 3 and len(full) == 2 * ds.steps_per_epoch(8)
    for stop in (3, 5):
        ds, loader = make()
        for step, _ in enumerate(loader):
            if step + 1 == stop:
                break
        state = ds.state_dict()
        resumed, loader = make()
        resumed.load_state_dict(state)
        replay = []
        for epoch in range(resumed.epoch, 2):
            resumed.set_epoch(epoch)
            replay += [b["sample_index"].tolist() for b in loader]
        assert replay == full[stop:], stop


def test_loops_without_set_epoch_move_on_to_the_next_epoch(local_dataset):
    ds = StreamingSequenceDataset(local_dataset, shuffle_buffer=64)
    loader = build_dataloader(ds, batch_size=100, strategy=None, masking=None)
    first = [b["sample_index"] for b in loader]
    second = [b["sample_index"] for b in loader]
    assert ds.epoch == 1 and len(first) == len(second) == 4
    assert not torch.equal(torch.cat(first), torch.cat(second))
    ds.set_epoch(1)  # the current, finished epoch: nothing left
    assert list(loader) == []


def run_segment(root, state, *, world_size, num_workers, batch_size, steps=None, shuffle=True):
    """Each rank's sample indices over `steps` batches (the rest of the epoch when None) after
    loading `state`, and rank 0's state at the end (ranks simulated as separate datasets)."""
    per_rank, states = [], []
    for rank in range(world_size):
        ds = StreamingSequenceDataset(root, rank=rank, world_size=world_size, shuffle_buffer=64, shuffle=shuffle)
        loader = build_dataloader(ds, batch_size=batch_size, num_workers=num_workers, strategy=None, masking=None)
        if state is not None:
            ds.load_state_dict(state)
        taken = []
        for step, batch in enumerate(loader, start=1):
            taken += batch["sample_index"].tolist()
            if step == steps:
                break
        per_rank.append(taken)
        states.append(ds.state_dict())
    assert all(s["batches_consumed"] == states[0]["batches_consumed"] for s in states)
    return per_rank, states[0]


# (ranks, workers, batch) before and after, and the steps taken before the resume.
ELASTIC_CASES = {
    "2 ranks -> 1": ((2, 0, 8), (1, 0, 8), 7),
    "1 rank -> 3 (remainder)": ((1, 0, 8), (3, 0, 8), 9),
    "1 rank -> 3": ((1, 0, 8), (3, 0, 8), 8),
    "2 workers -> 0": ((1, 2, 8), (1, 0, 8), 13),
    "batch 8 -> 12": ((1, 0, 8), (1, 0, 12), 5),
}


@pytest.mark.parametrize("case", list(ELASTIC_CASES))
def test_elastic_resume_trains_every_row_of_the_epoch_once(local_dataset, case):
    (ranks, workers, batch), (ranks_after, workers_after, batch_after), steps = ELASTIC_CASES[case]
    before, state = run_segment(local_dataset, None, world_size=ranks, num_workers=workers, batch_size=batch,
                                steps=steps)
    assert state["batches_consumed"] == steps
    after, end = run_segment(local_dataset, state, world_size=ranks_after, num_workers=workers_after,
                             batch_size=batch_after)
    trained = [i for rank in before + after for i in rank]
    left = 400 - ranks * steps * batch
    padded = -left % ranks_after  # the remainder policy on what is left: repeats from its start
    assert len(trained) == 400 + padded
    counts = collections.Counter(trained)
    assert set(counts) == set(range(400)) and sum(c - 1 for c in counts.values()) == padded
    # Every new rank takes the same steps, and the epoch is finished on each.
    assert len({len(rank) for rank in after}) == 1
    assert end["samples_consumed"] == len(after[0]) and len(end["segments"]) == 1


@pytest.mark.parametrize("case", ["2 ranks -> 1", "1 rank -> 3", "batch 8 -> 12"])
def test_elastic_resume_deals_the_rest_in_the_global_order(local_dataset, case):
    """Unshuffled, the global order is the dataset's order: what is left of it, cut into one
    contiguous share per new rank."""
    (ranks, workers, batch), (ranks_after, workers_after, batch_after), steps = ELASTIC_CASES[case]
    before, state = run_segment(local_dataset, None, world_size=ranks, num_workers=workers, batch_size=batch,
                                steps=steps, shuffle=False)
    after, _ = run_segment(local_dataset, state, world_size=ranks_after, num_workers=workers_after,
                           batch_size=batch_after, shuffle=False)
    rest = sorted(set(range(400)) - {i for rank in before for i in rank})
    share = -(-len(rest) // ranks_after)
    assert after == [rest[r * share:(r + 1) * share] for r in range(ranks_after)]


def test_two_elastic_resumes_in_one_epoch_and_the_next_epoch_is_whole(local_dataset):
    first, state = run_segment(local_dataset, None, world_size=2, num_workers=0, batch_size=8, steps=5)
    second, state = run_segment(local_dataset, state, world_size=1, num_workers=0, batch_size=12, steps=6)
    assert len(state["segments"]) == 1 and state["batches_consumed"] == 6
    third, state = run_segment(local_dataset, state, world_size=4, num_workers=0, batch_size=8)
    assert len(state["segments"]) == 2
    trained = [i for rank in first + second + third for i in rank]
    assert sorted(trained) == list(range(400))  # 400 - 80 - 72 = 248 rows left, 4 x 62
    # The same layout again continues exactly: here, past the end of the epoch, into the next, whole one.
    ds = StreamingSequenceDataset(local_dataset, rank=0, world_size=4, shuffle_buffer=64)
    loader = build_dataloader(ds, batch_size=8, strategy=None, masking=None)
    ds.load_state_dict(state)
    assert ds.rows_per_rank() == 62 and ds.epoch == 0
    nxt = [i for b in loader for i in b["sample_index"].tolist()]
    assert ds.epoch == 1 and ds.state_dict()["segments"] == []
    assert nxt == epoch_indices(local_dataset, world_size=4, num_workers=0, batch_size=8, epoch=1,
                                shuffle_buffer=64)[0]


def test_resume_needs_the_same_order(local_dataset):
    ds = StreamingSequenceDataset(local_dataset, shuffle_buffer=64)
    build_dataloader(ds, batch_size=16, strategy=None, masking=None)
    state = ds.state_dict()
    with pytest.raises(ValueError, match="seed"):
        StreamingSequenceDataset(local_dataset, seed=1, shuffle_buffer=64).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle_buffer"):
        StreamingSequenceDataset(local_dataset, shuffle_buffer=32).load_state_dict(state)


def test_masking_in_workers_equals_masking_after_transfer(local_dataset):
    ds = StreamingSequenceDataset(local_dataset, seed=2, shuffle_buffer=64)
    config = MaskingConfig.from_manifest(ds.manifest, whole_word=True)
    in_workers = list(build_dataloader(ds, batch_size=32, num_workers=2, strategy="difference", masking=config, seed=2))
    ds2 = StreamingSequenceDataset(local_dataset, seed=2, shuffle_buffer=64)
    plain = list(build_dataloader(ds2, batch_size=32, num_workers=2, strategy=None, masking=None,
                                  mask_in_workers=False))
    for a, b in zip(in_workers, plain, strict=True):
        later = apply_masking(b, "difference", config, seed=2, epoch=ds2.epoch)
        assert torch.equal(a["input_ids"], later["input_ids"]) and torch.equal(a["labels"], later["labels"])


def test_a_sample_gets_the_same_mask_on_any_number_of_ranks_and_workers(local_dataset):
    def masks(world_size, num_workers, batch_size):
        found = {}
        for rank in range(world_size):
            ds = StreamingSequenceDataset(local_dataset, seed=3, shuffle_buffer=64, rank=rank, world_size=world_size)
            config = MaskingConfig.from_manifest(ds.manifest)
            loader = build_dataloader(ds, batch_size=batch_size, num_workers=num_workers, strategy="random",
                                      masking=config, seed=3)
            for b in loader:
                for i, index in enumerate(b["sample_index"].tolist()):
                    n = int(b["attention_mask"][i].sum())
                    found[index] = (b["input_ids"][i, :n].tolist(), b["labels"][i, :n].tolist())
        return found

    one = masks(1, 0, 32)
    assert len(one) == 400 and masks(2, 2, 16) == one


def test_masking_config_from_the_manifest(local_dataset):
    from transformers import AutoTokenizer

    from maskstream.models import default_model

    ds = StreamingSequenceDataset(local_dataset)
    tok = AutoTokenizer.from_pretrained(default_model())
    config = MaskingConfig.from_manifest(ds.manifest, whole_word=True)
    assert config == MaskingConfig.from_tokenizer(tok, whole_word=True)
    assert config.mask_token_id == tok.mask_token_id and config.vocab_size == 30522
    broken = dataclasses.replace(ds.manifest, tokenizer={"name": "x"})
    with pytest.raises(ValueError, match="mask_token_id"):
        MaskingConfig.from_manifest(broken)


def copy_dataset(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_checksum_mismatch_names_the_shard(local_dataset, tmp_path):
    root = copy_dataset(local_dataset, tmp_path / "ds")
    shard = root / "v1" / "shard-00001-of-00003.parquet"
    rows = pq.read_table(shard).to_pylist()
    rows[0]["input_ids"][1] += 1  # same rows and schema, one token changed: only the checksum can tell
    pq.write_table(pa.Table.from_pylist(rows, schema=SEQUENCE_SCHEMA), shard, row_group_size=40)
    ds = StreamingSequenceDataset(str(root), shuffle=False)
    with pytest.raises(ChecksumMismatch, match="shard-00001-of-00003.parquet"):
        list(ds)
    unchecked = StreamingSequenceDataset(str(root), shuffle=False, verify_checksums=False)
    assert len(list(unchecked)) == 400


def test_unknown_schema_version_and_row_count_are_refused(local_dataset, tmp_path):
    root = copy_dataset(local_dataset, tmp_path / "ds")
    manifest_path = root / "v1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "schema_version": 99}))
    with pytest.raises(ManifestError, match="schema version 99"):
        StreamingSequenceDataset(str(root))
    manifest["shards"][2]["rows"] += 1
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="shard-00002-of-00003.parquet holds"):
        StreamingSequenceDataset(str(root))


@pytest.mark.slow
def test_reads_from_gcs(local_dataset, gcs_bucket):
    fs = fsspec.filesystem("gs", token="anon")
    fs.put(local_dataset, f"{gcs_bucket}/data", recursive=True)
    remote = StreamingSequenceDataset(f"{gcs_bucket}/data", seed=4, shuffle_buffer=64, world_size=2, rank=1)
    local = StreamingSequenceDataset(local_dataset, seed=4, shuffle_buffer=64, world_size=2, rank=1)
    assert remote.version_url == f"{gcs_bucket}/data/v1"
    got = [(s["sample_index"], s["input_ids"].tolist()) for s in remote]
    assert got == [(s["sample_index"], s["input_ids"].tolist()) for s in local]
    assert len(got) == 200


def test_the_rows_each_worker_had_yielded_follow_the_round_robin():
    """`RankPlan.taken_by_worker` against the DataLoader's order built by hand (a batch from each
    worker in turn, skipping exhausted ones), after any number of rows or batches, for layouts where
    a worker's short last batch comes before other workers are done."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        workers, batch, rows, buffer = (int(v) for v in (rng.integers(1, 4), rng.integers(1, 10),
                                                          rng.integers(1, 200), rng.integers(1, 60)))
        plan = RankPlan.of(Layout(1, workers, batch), 0, rows, buffer)
        streams = []
        for worker in range(len(plan.batches)):
            mine = [r for start, stop in plan.worker_windows(worker) for r in range(start, stop)]
            streams.append([len(mine[i : i + batch]) for i in range(0, len(mine), batch)])
        order, next_batch, turn = [], [0] * len(streams), 0
        while any(n < len(s) for n, s in zip(next_batch, streams, strict=True)):
            while next_batch[turn] >= len(streams[turn]):
                turn = (turn + 1) % len(streams)
            order.append((turn, streams[turn][next_batch[turn]]))
            next_batch[turn], turn = next_batch[turn] + 1, (turn + 1) % len(streams)
        yielded = [worker for worker, size in order for _ in range(size)]
        for count in range(len(yielded) + 1):
            assert plan.taken_by_worker(batch, rows=count) == np.bincount(
                yielded[:count], minlength=len(streams)).tolist(), (workers, batch, rows, buffer, count)
        for count in range(len(order) + 1):
            expected = [sum(size for w, size in order[:count] if w == worker) for worker in range(len(streams))]
            assert plan.taken_by_worker(batch, batches=count) == expected
        assert plan.taken_by_worker(batch, rows=-1) == np.bincount(yielded, minlength=len(streams)).tolist()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world_size=st.integers(1, 2), num_workers=st.integers(0, 2), batch_size=st.integers(1, 23),
       fraction=st.sampled_from([0.0, 0.05, 0.3, 0.9]), stop=st.integers(0, 40))
def test_held_out_rows_leave_in_the_workers_as_the_training_process_dropped_them(
        odd_dataset, world_size, num_workers, batch_size, fraction, stop):
    """`build_dataloader(held_out_fraction=...)` yields, batch for batch, the rows and masks of the full
    batch minus its held-out rows (what `maskstream train` selected in its own process before), with
    `rows_read` the full batch's rows; a batch wholly held out is `{"rows_read": n}`. The position
    counts rows read, so a resume after any batch continues the same batches."""
    config = MaskingConfig.from_manifest(StreamingSequenceDataset(odd_dataset).manifest)

    def loader(rank, fraction_or_none):
        ds = StreamingSequenceDataset(odd_dataset, seed=3, rank=rank, world_size=world_size, shuffle_buffer=32)
        return ds, build_dataloader(ds, batch_size=batch_size, num_workers=num_workers, strategy="difference",
                                    masking=config, seed=5, held_out_fraction=fraction_or_none)

    for rank in range(world_size):
        full_ds, full = loader(rank, None)
        dropped_ds, dropped = loader(rank, fraction)
        pairs = list(zip(full, dropped, strict=True))
        assert dropped_ds.position() == full_ds.position()
        for whole, batch in pairs:
            keep = ~held_out(whole["sample_index"].numpy(), fraction)
            assert batch.pop("rows_read") == len(keep)
            if not keep.any():
                assert batch == {}
                continue
            assert batch.keys() == whole.keys()
            for name in ("sample_index", "input_ids", "labels", "attention_mask", "mask_probability", "word_ids"):
                assert torch.equal(batch[name], whole[name][torch.from_numpy(keep)]), name  # width too
            assert torch.equal(batch["masked_positions"], masked_positions(batch["labels"]))
        # A resume after `stop` batches (any but the last: then the next iteration is the next epoch)
        # reads the rest as the run that went on did.
        taken = min(stop, len(pairs) - 1)
        ds, resumed = loader(rank, fraction)
        for _ in zip(range(taken), resumed, strict=False):
            pass
        state = ds.state_dict()
        again, rest = loader(rank, fraction)
        again.load_state_dict(state)
        expected = [b["sample_index"].tolist() for _, b in pairs[taken:] if "sample_index" in b]
        got = [b["sample_index"].tolist() for b in rest if "sample_index" in b]
        assert got == expected, (rank, taken)
        del full, dropped, resumed, rest
        gc.collect()  # the loaders' persistent workers end with them

"""Mixtures (`--mix`): the draw's proportions, rows that are the sources' own, masking by source,
exact resume, and `maskstream train --mix` end to end."""

from __future__ import annotations

import collections
import functools
import itertools
import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from maskstream.cli import main
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.loader import build_dataloader
from maskstream.trainer.masking import MaskingConfig, apply_masking
from maskstream.trainer.metrics import read_metrics
from maskstream.trainer.mixture import (
    DatasetSource,
    MixSource,
    Mixture,
    TextSource,
    mask_by_source,
    mixture_weights,
    source_schedule,
    source_seed,
)
from testing import sequence_dataset as factory


@pytest.mark.parametrize("weights", [[0.8, 0.2], [0.5, 0.3, 0.15, 0.05], [0.95, 0.05], [0.16, 0.28, 0.28, 0.28]])
def test_proportions_hold_within_2_percent_over_any_1000_samples(weights):
    labels = source_schedule(7, weights, 0, 200_000)
    for source, weight in enumerate(weights):
        running = np.concatenate([[0], np.cumsum(labels == source)])
        window = running[1000:] - running[:-1000]  # every 1,000 consecutive samples
        assert np.abs(window / 1000 - weight).max() <= 0.02, (source, window.min(), window.max())
    # A function of the seed and the sample alone: any slice is the same wherever it is drawn from.
    assert (source_schedule(7, weights, 12_345, 999) == labels[12_345:13_344]).all()
    assert not (source_schedule(8, weights, 0, 1000) == labels[:1000]).all()


def test_mix_entries_and_weights_are_checked():
    assert MixSource.parse("gs://bucket/general:0.2") == MixSource("gs://bucket/general", 0.2)
    assert MixSource.parse("general/*.jsonl:0.1").is_text and not MixSource.parse("out/general:0.1").is_text
    for bad in ("general.jsonl", "general.jsonl:1.5", "general.jsonl:x", ":0.2"):
        with pytest.raises(ValueError, match="SOURCE:WEIGHT"):
            MixSource.parse(bad)
    with pytest.raises(ValueError, match="sum"):
        mixture_weights([MixSource("a.jsonl", 0.6), MixSource("b.jsonl", 0.4)])
    # Three sources of 0.325 would leave the domain 0.025, less than 1/20 per source: a block of 20 could
    # not hold every source's rounded-up share.
    with pytest.raises(ValueError, match="at least 0.15"):
        mixture_weights([MixSource(f"{name}.jsonl", 0.325) for name in "abc"])



@pytest.fixture
def text_file(tmp_path):
    """The shipped descriptions as general text, with a record without text (skipped)."""
    texts = factory.read_texts(limit=300)
    path = tmp_path / "general.jsonl"
    path.write_text("\n".join([json.dumps({"text": t}) for t in texts] + ['{"title": "no text"}']) + "\n")
    return path, texts


def make_mixture(local_dataset, text_path, *, rank=0, world_size=1, batch_size=20, workers=0, state=None,
                 held_out_fraction=0.0):
    """Rank `rank` of a 0.8/0.2 mixture of the 400-row domain and the text records."""
    dataset = StreamingSequenceDataset(local_dataset, seed=3, shuffle_buffer=64, rank=rank, world_size=world_size)
    loader = build_dataloader(dataset, batch_size=batch_size, num_workers=workers, strategy=None, masking=None,
                              collate=False)
    text = TextSource(str(text_path), factory.tokenizer(), 128, batch_size=batch_size, rank=rank,
                      world_size=world_size)
    mixture = Mixture([DatasetSource(dataset, loader), text], [0.8, 0.2], ["difference", "random"], seed=3,
                      batch_size=batch_size, rank=rank, world_size=world_size,
                      pad_token_id=dataset.manifest.tokenizer["pad_token_id"], held_out_fraction=held_out_fraction)
    if state is not None:
        mixture.load_state_dict(state)
    return mixture


def test_a_mixture_leaves_the_domains_held_out_rows_out_before_collating(local_dataset, text_file, monkeypatch):
    """Issue 75: held-out rows were dropped from the pinned batch, which copied it back into pageable
    memory (and the transfer then waits). Now they never reach the batch: the same draw, less the domain's
    held-out rows (the text source's rows are all trained), collated once, and `batches()` hands on the
    mixture's own batch object."""
    from maskstream.trainer.held_out import held_out
    from maskstream.trainer.training_data import TrainingData

    path, _ = text_file
    every_row = make_mixture(local_dataset, path)
    whole = [rows_of(every_row.next_batch()) for _ in range(10)]
    mixture = make_mixture(local_dataset, path, held_out_fraction=0.2)
    collated = []
    monkeypatch.setattr(mixture, "next_batch", lambda original=mixture.next_batch: collated.append(original())
                        or collated[-1])
    data = TrainingData.__new__(TrainingData)  # only what `batches()` reads of a mixture run
    data.mixture, data.resume_rng = mixture, None
    data.config = type("Config", (), {"held_out_fraction": 0.2})()
    yielded = list(itertools.islice(data.batches(), 9))
    expected = [[row for row in rows if not (row[0] == 0 and held_out([row[2]], 0.2)[0])] for rows in whole]
    assert [rows_of(batch) for _, batch, _ in yielded] == [rows for rows in expected if rows][:9]
    assert all(batch is collated[i] for i, (_, batch, _) in enumerate(yielded))  # no copy made after the mixture's
    assert sum(len(rows) for rows in whole[:9]) > sum(len(rows) for rows in expected[:9])  # some rows held out
    assert [dealt for _, _, dealt in yielded] == [20] * 9  # every row dealt is counted, the held-out ones too


def test_mixture_rows_are_the_sources_rows_in_the_drawn_proportions(local_dataset, text_file):
    path, texts = text_file
    mixture = make_mixture(local_dataset, path)
    batches = [mixture.next_batch() for _ in range(50)]  # 1,000 samples: the domain's 400 rows cycle
    sources = torch.cat([b["source"] for b in batches])
    assert (sources.numpy() == source_schedule(3, [0.8, 0.2], 0, 1000)).all()
    assert sources.float().mean().item() == pytest.approx(0.2, abs=0.005)
    domain_dataset = mixture.sources[0].dataset
    stored_ids = [ids for i in range(len(domain_dataset.manifest.shards))  # sample index = manifest order
                  for ids in pq.read_table(domain_dataset.shard_url(i)).column("input_ids").to_pylist()]
    tokenizer = factory.tokenizer()
    for batch in batches[:10]:
        for row in range(len(batch["source"])):
            ids = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
            index = int(batch["sample_index"][row])
            if batch["source"][row] == 0:
                assert ids == stored_ids[index]
            else:  # the text source's record `index`, tokenized on the fly
                assert ids == tokenizer(texts[index], truncation=True, max_length=128)["input_ids"]
    # Each source keeps its own order: the domain's rows are its epoch 0 order, then epoch 1's.
    domain = torch.cat([b["sample_index"][b["source"] == 0] for b in batches])
    epochs = torch.cat([b["epoch"][b["source"] == 0] for b in batches])
    assert sorted(domain[epochs == 0].tolist()) == list(range(400)) and (epochs[:400] == 0).all()


def test_each_source_is_masked_with_its_own_strategy(local_dataset, text_file):
    mixture = make_mixture(local_dataset, text_file[0])
    batch = mixture.next_batch()
    masking = MaskingConfig.from_manifest(mixture.sources[0].dataset.manifest)
    masked = mask_by_source(batch, mixture.strategies, masking, seed=3)
    for source, strategy in enumerate(mixture.strategies):
        rows = batch["source"] == source
        part = {k: v[rows] for k, v in batch.items() if k not in ("source", "epoch")}
        alone = apply_masking(part, strategy, masking, seed=source_seed(3, source), epoch=0)
        assert torch.equal(masked["labels"][rows], alone["labels"])
        assert torch.equal(masked["input_ids"][rows], alone["input_ids"])
    # Text rows have no mask probabilities (difference masking would mask none of them); random masks them.
    text_rows = batch["source"] == 1
    assert (batch["mask_probability"][text_rows] == 0).all() and (masked["labels"][text_rows] != -100).any()


def test_mixture_resumes_exactly(local_dataset, text_file):
    path, _ = text_file
    mixture = make_mixture(local_dataset, path, batch_size=16)
    for _ in range(7):
        mixture.next_batch()
    state = json.loads(json.dumps(mixture.state_dict()))  # as a checkpoint holds it
    expected = [mixture.next_batch() for _ in range(30)]  # crosses the domain's epoch
    # A state taken right after the resume, before any source is read again, still knows the rows to skip.
    again = json.loads(json.dumps(make_mixture(local_dataset, path, batch_size=16, state=state).state_dict()))
    resumed = make_mixture(local_dataset, path, batch_size=16, state=again)
    for want in expected:
        got = resumed.next_batch()
        for key in ("input_ids", "sample_index", "source", "epoch"):
            assert torch.equal(got[key], want[key]), key


@pytest.mark.slow
def test_train_with_a_text_mixture(local_dataset, text_file, tiny_bert, tmp_path):
    path, _ = text_file
    out = tmp_path / "mixed"
    log = tmp_path / "samples.jsonl"
    assert main(["train", "--dataset", local_dataset, "--mix", f"{path}:0.2", "--output", str(out), "--model",
                 tiny_bert, "--batch-size", "25", "--max-steps", "8", "--log-every", "4", "--num-workers", "0",
                 "--eval-samples", "8", "--sample-log", str(log)]) == 0
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert [r["step"] for r in train] == [4, 8]
    counts = collections.Counter()
    for record in train:
        counts.update(record["samples_by_source"])
    samples = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(counts.values()) == len(samples) and counts[str(path)] == sum(s["source"] == str(path) for s in samples)
    # 200 samples drawn, 40 of them text; held-out domain rows are dropped, text rows never.
    assert counts[str(path)] == 40 and 140 <= sum(counts.values()) - 40 <= 160


@pytest.mark.slow
def test_a_dataset_source_in_transformers_trainer(local_dataset, odd_dataset, text_file, tiny_bert, tmp_path):
    """A mixture of the domain, another maskstream version (random masking) and text through
    `transformers.Trainer` with MixtureRows and MixtureCollator: the Trainer's batches are the
    mixture's, and the loss is finite."""
    from transformers import AutoModelForMaskedLM, Trainer, TrainingArguments

    from maskstream.trainer.hf import MixtureCollator, MixtureRows
    from maskstream.trainer.mixture import build_mixture

    domain = StreamingSequenceDataset(local_dataset, seed=0)
    mixture = build_mixture(domain, [f"{odd_dataset}:0.3", f"{text_file[0]}:0.2"], factory.tokenizer(),
                            strategy="difference", seed=0, batch_size=10)
    assert mixture.strategies == ["difference", "random", "random"] and mixture.weights == pytest.approx([0.5, 0.3, 0.2])
    seen = []

    class Recording(MixtureCollator):
        def __call__(self, rows):
            seen.append(torch.stack([row["source"] for row in rows]))
            return super().__call__(rows)

    args = TrainingArguments(str(tmp_path / "hf"), max_steps=6, per_device_train_batch_size=10, report_to=[],
                             logging_steps=1, use_cpu=True, learning_rate=1e-3, remove_unused_columns=False,
                             save_strategy="no")
    trainer = Trainer(model=AutoModelForMaskedLM.from_pretrained(tiny_bert), args=args,
                      train_dataset=MixtureRows(mixture), data_collator=Recording(mixture))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 6 and all(np.isfinite(losses))
    drawn = torch.cat(seen[:6]).numpy()
    assert (drawn == source_schedule(0, [0.5, 0.3, 0.2], 0, 60)).all()


def test_a_text_source_reads_every_file_a_glob_or_folder_names(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "notes.txt").write_text("not a source")
    for url in (f"{tmp_path}/*.jsonl", str(tmp_path), f"file://{tmp_path}/*.jsonl"):
        assert [f.rsplit("/", 1)[1] for f in TextSource._files(url)] == ["a.jsonl", "b.jsonl"], url


def rows_of(batch):
    return list(zip(batch["source"].tolist(), batch["epoch"].tolist(), batch["sample_index"].tolist(), strict=True))


# (world size, loader workers, batch) before and after, the steps taken before, and the sources whose
# saved ranks are in different epochs: the 400-row domain takes about 0.8 of each batch and the 300
# text records the rest, so each rank crosses a source's epoch at its own step.
ELASTIC_MIXTURES = {
    "2 ranks -> 1, mid epoch": ((2, 0, 16), (1, 0, 20), 9, ()),
    "1 rank, 2 workers -> 2 ranks, batch 8 -> 12": ((1, 2, 8), (2, 0, 12), 27, ()),
    "3 ranks -> 1, ranks in two epochs of the domain": ((3, 0, 16), (1, 0, 16), 11, (0,)),
    "3 ranks -> 2 with 2 workers, ranks in two epochs of each source": ((3, 0, 16), (2, 2, 16), 31, (0, 1)),
}


@pytest.mark.parametrize("case", list(ELASTIC_MIXTURES))
def test_a_mixture_resumes_on_another_layout_taking_each_row_once(case, local_dataset, text_file):
    (ranks, workers, batch), (ranks_after, workers_after, batch_after), steps, straddling = ELASTIC_MIXTURES[case]
    path, texts = text_file
    before = [make_mixture(local_dataset, path, rank=r, world_size=ranks, batch_size=batch, workers=workers)
              for r in range(ranks)]
    taken = [row for _ in range(steps) for mixture in before for row in rows_of(mixture.next_batch())]
    states = json.loads(json.dumps([mixture.state_dict() for mixture in before]))  # as a checkpoint holds them
    for source in (0, 1):
        assert (len({s["positions"][source]["epoch"] for s in states}) > 1) == (source in straddling)
    after = [make_mixture(local_dataset, path, rank=r, world_size=ranks_after, batch_size=batch_after,
                          workers=workers_after) for r in range(ranks_after)]
    for mixture in after:
        mixture.load_state_dict(states)
    resumed_in = [max(p["epoch"] for p in (s["positions"][source] for s in states)) for source in (0, 1)]
    drawn = []
    while any(min(m.sources[source].state_dict()["epoch"] for m in after) <= resumed_in[source]
              for source in (0, 1)):  # until every new rank is past the epochs the saved ranks were in
        drawn += [mixture.next_batch() for mixture in after]
    taken += [row for batch in drawn for row in rows_of(batch)]
    # The draw goes on from the saved sample count: proportions hold across the resume.
    samples = steps * ranks * batch
    assert [b["source"].tolist() for b in drawn[:ranks_after]] == [
        source_schedule(3, [0.8, 0.2], samples + r * batch_after, batch_after).tolist() for r in range(ranks_after)]
    # Every epoch each new rank is past of each source: each row taken once, but for the domain's
    # remainder policy (fewer repeats than ranks, on the epoch and on what was left of it).
    for source, size in ((0, 400), (1, len(texts))):
        for epoch in range(min(m.sources[source].state_dict()["epoch"] for m in after)):
            counts = collections.Counter(i for s, e, i in taken if (s, e) == (source, epoch))
            assert set(counts) == set(range(size)), (source, epoch, sorted(set(range(size)) - set(counts))[:10])
            repeats = sum(c - 1 for c in counts.values())
            assert repeats <= ((ranks - 1) + (ranks_after - 1) if source == 0 else 0), (source, epoch, repeats)
    # The states the ranks had differ (each takes its own rows), and a single rank's is not enough.
    assert len({json.dumps(s["positions"]) for s in states}) == ranks or ranks == 1
    if ranks > 1:
        with pytest.raises(ValueError, match="every rank's"):
            after[0].load_state_dict(states[:1])


@pytest.mark.slow
def test_a_mixture_follows_each_maskstream_source_and_resumes_exactly(text_file, tiny_bert, tmp_path, monkeypatch):
    """--follow-latest with --mix: the domain (started on v1, `latest` -> v2) and a replayed maskstream
    source (given as its v1) each move on to v2 at their own epoch boundary; a run resumed from a
    checkpoint taken between the two switches trains the same rows."""
    from maskstream.trainer import checkpoint
    from maskstream.trainer import train as train_loop

    texts = factory.read_texts(limit=200)
    domain, general = tmp_path / "domain", tmp_path / "general"
    factory.write_dataset(str(domain), factory.sequence_rows(texts[:48], max_length=48), shards=2, row_group_size=8,
                          version="v1")
    factory.write_dataset(str(domain), factory.sequence_rows(texts[48:88], max_length=48), shards=2,
                          row_group_size=8, version="v2")
    factory.write_dataset(str(general), factory.sequence_rows(texts[88:118], max_length=48), shards=1,
                          row_group_size=8, version="v1")
    factory.write_dataset(str(general), factory.sequence_rows(texts[118:148], max_length=48), shards=1,
                          row_group_size=8, version="v2")
    # the loop saves through its own name for it (imported at the top of train.py)
    monkeypatch.setattr(train_loop, "save_checkpoint", functools.partial(checkpoint.save_checkpoint, keep=0))

    def train(out, *extra):
        assert main(["train", "--dataset", str(domain / "v1"), "--follow-latest", "--mix", f"{general / 'v1'}:0.25",
                     "--mix", f"{text_file[0]}:0.15", "--output", str(out), "--model", tiny_bert, "--batch-size", "8",
                     "--max-steps", "30", "--save-every", "1", "--held-out-fraction", "0", "--eval-every", "1000",
                     "--log-every", "10", "--sample-log", str(out / "samples.jsonl"), *extra]) == 0
        return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]

    (tmp_path / "run").mkdir()
    rows = train(tmp_path / "run")
    for name, first, size in (("", domain, 48), (f"{general}/", general, 30)):
        versions = collections.defaultdict(set)
        for r in rows:
            if r["source"].startswith(f"{name}v") and (not name or r["source"].startswith(str(first))):
                versions[r["epoch"]].add(r["source"])
        assert versions[0] == {f"{name}v1"} and all(v == {f"{name}v2"} for e, v in versions.items() if e > 0), versions
        epoch0 = [r["sample_index"] for r in rows if r["source"] == f"{name}v1"]
        assert sorted(epoch0) == list(range(size)) and len(versions) > 1
    # Step 12: the domain reads v2, the general source still v1 with v2 pending.
    switched = {r["source"] for r in rows if r["step"] <= 12}
    assert {"v2", f"{general}/v1"} <= switched and f"{general}/v2" not in switched
    resumed_out = tmp_path / "resumed"
    resumed_out.mkdir()
    (resumed_out / "checkpoints").mkdir()
    shutil.copytree(tmp_path / "run" / "checkpoints" / "step-00000012", resumed_out / "checkpoints" / "step-00000012")
    resumed = train(resumed_out, "--resume", str(resumed_out / "checkpoints" / "step-00000012"))
    assert resumed == [r for r in rows if r["step"] > 12]


def test_a_text_source_tokenizes_in_workers_the_batches_of_one_process(text_file):
    def first_batches(workers, state=None):
        """The first 12 (epoch, records, token ids) batches: 150 records a rank, into the second epoch."""
        source = TextSource(str(text_file[0]), factory.tokenizer(), 128, batch_size=16, rank=1, world_size=2,
                            num_workers=workers)
        if state is not None:
            source.load_state_dict(state)
        batches = source.batches()
        return [(epoch, [s["sample_index"] for s in samples], [s["input_ids"].tolist() for s in samples])
                for epoch, samples in (next(batches) for _ in range(12))]

    expected = first_batches(0)
    assert first_batches(2) == expected
    assert [epoch for epoch, *_ in expected] == [0] * 10 + [1] * 2
    assert expected[0][1] == list(range(1, 32, 2))  # records 1, 3, ... of 2 ranks
    tokenizer = factory.tokenizer()
    assert expected[0][2][0] == tokenizer(text_file[1][1], truncation=True, max_length=128)["input_ids"]
    # Resumed from the state after 4 batches, with workers: the same batches follow.
    source = TextSource(str(text_file[0]), factory.tokenizer(), 128, batch_size=16, rank=1, world_size=2)
    batches = source.batches()
    for _ in range(4):
        next(batches)
    assert first_batches(2, state=source.state_dict())[:8] == expected[4:]


@pytest.mark.slow
def test_a_mixture_resumes_with_the_same_losses(local_dataset, text_file, tiny_bert, tmp_path, monkeypatch):
    """The model's random state (dropout) continues exactly: the sources' loaders, started again after
    the resume, draw from generators of their own."""
    from maskstream.trainer import checkpoint
    from maskstream.trainer import train as train_loop

    # the loop saves through its own name for it (imported at the top of train.py)
    monkeypatch.setattr(train_loop, "save_checkpoint", functools.partial(checkpoint.save_checkpoint, keep=0))

    def train(out, *extra):
        out.mkdir(exist_ok=True)
        assert main(["train", "--dataset", local_dataset, "--mix", f"{text_file[0]}:0.2", "--output", str(out),
                     "--model", tiny_bert, "--batch-size", "16", "--max-steps", "8", "--log-every", "1",
                     "--save-every", "1", "--eval-every", "1000", "--held-out-fraction", "0", *extra]) == 0
        return {r["step"]: r["loss"] for r in read_metrics(out) if r["split"] == "train"}

    run = train(tmp_path / "run")
    resumed_out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "run" / "checkpoints" / "step-00000004", resumed_out / "checkpoints" / "step-00000004")
    resumed = train(resumed_out, "--resume", str(resumed_out / "checkpoints" / "step-00000004"))
    assert [resumed[s] for s in range(5, 9)] == [run[s] for s in range(5, 9)]


def test_a_text_source_masked_with_difference_takes_the_domains_mask_map(local_dataset, text_file, monkeypatch):
    """`--mix TEXT:WEIGHT:difference`: the text's rows carry the map's word ids and mask probabilities
    (as `MaskMap.probabilities` gives them for the same text), and difference masking draws the budget."""
    import pyarrow as pa

    from maskstream.mask_signal.mask_map import MaskMap
    from maskstream.mask_signal.words import words

    path, texts = text_file
    vocabulary = sorted({w for text in texts for w in words(text)})
    similarity = np.random.default_rng(0).random(len(vocabulary)).astype(np.float32)
    settings = {"budget": 0.15, "alpha": 1.0, "weighting": "similarity", "sharpness": 1.0, "floor": 0.0,
                "max_length": 128}
    mask_map = MaskMap.of_words(pa.array(vocabulary), np.arange(len(vocabulary)), similarity, settings,
                                factory.tokenizer_entry(), {"url": "test"})
    assert MixSource.parse(f"{path}:0.2:difference") == MixSource(str(path), 0.2, "difference")
    with pytest.raises(ValueError, match="STRATEGY"):
        MixSource.parse(f"{path}:0.2:sometimes")

    from maskstream.trainer.mixture import build_mixture

    domain = StreamingSequenceDataset(local_dataset, seed=0)
    # The fixture's version has no word table: its map cannot be read, and the mixture says so.
    with pytest.raises(ValueError, match="the mask map of .* cannot be read"):
        build_mixture(domain, [f"{path}:0.2:difference"], factory.tokenizer(), strategy="difference", seed=0,
                      batch_size=20)
    monkeypatch.setattr(MaskMap, "from_version", classmethod(lambda cls, url: mask_map))
    mixture = build_mixture(domain, [f"{path}:0.2:difference"], factory.tokenizer(), strategy="difference", seed=0,
                            batch_size=20)
    assert mixture.strategies == ["difference", "difference"]
    batch = mixture.next_batch()
    text_rows = (batch["source"] == 1).nonzero().flatten().tolist()
    tokenizer = factory.tokenizer()
    for row in text_rows:
        index, length = int(batch["sample_index"][row]), int(batch["attention_mask"][row].sum())
        (expected,) = mask_map.probabilities([texts[index]], tokenizer, max_length=128)
        assert np.array_equal(batch["mask_probability"][row, :length].numpy(), expected)
    assert batch["mask_probability"][text_rows].sum() > 0
    masked = mask_by_source(batch, mixture.strategies, MaskingConfig.from_manifest(domain.manifest), seed=0)
    for row in text_rows:  # the budget of each row: round(0.15 x its non-special tokens)
        tokens = int((~batch["special_tokens_mask"][row]).sum())
        assert int((masked["labels"][row] != -100).sum()) == round(0.15 * tokens)


def test_a_version_switch_found_mid_batch_survives_an_exact_resume(tmp_path):
    """A newer version of a replayed source found while a batch of it is partly used is in the state:
    the resumed mixture moves on at the same epoch boundary, and rank 0 leases the old version until
    no rank reads it, then only the new one."""
    from maskstream.storage.lease import VersionLease
    from maskstream.trainer.mixture import build_mixture

    texts = factory.read_texts(limit=120)
    domain_root, general = tmp_path / "domain", tmp_path / "general"
    factory.write_dataset(str(domain_root), factory.sequence_rows(texts[:60], max_length=48), shards=1,
                          row_group_size=8, version="v1")
    factory.write_dataset(str(general), factory.sequence_rows(texts[60:90], max_length=48), shards=1,
                          row_group_size=8, version="v1")

    def build(state=None):
        domain = StreamingSequenceDataset(str(domain_root), seed=0)
        mixture = build_mixture(domain, [f"{general}/v1:0.3"], factory.tokenizer(), strategy="difference", seed=0,
                                batch_size=8, follow=True, lease=VersionLease(domain.version_url))
        mixture.poll_every = 10**6  # polls at the first step only: the switch below comes from the state alone
        if state is not None:
            mixture.load_state_dict(state)
        return mixture

    mixture = build()
    for _ in range(2):
        mixture.next_batch()
    factory.write_dataset(str(general), factory.sequence_rows(texts[90:120], max_length=48), shards=1,
                          row_group_size=8, version="v2")  # `latest` -> v2
    mixture._poll()  # the poll of a later step: v2, after the epoch of the source this rank is in
    state = json.loads(json.dumps(mixture.state_dict()))
    assert state["sources"][1]["used"] > 0 and state["sources"][1]["state"]["pending"]["url"].endswith("v2")
    expected = [rows_of(mixture.next_batch()) for _ in range(30)]  # past the source's 30-row epoch
    first, second = f"{general}/v1", f"{general}/v2"
    assert mixture.sources[1].versions == [(0, first), (1, second)]
    resumed = build(state)
    assert [rows_of(resumed.next_batch()) for _ in range(30)] == expected
    assert resumed.sources[1].versions == [(0, first), (1, second)]
    # Leases: both versions while one is still read or pending, then (at the next poll) the new one only.
    assert set(resumed.sources[1].leases) == {first, second}
    resumed._hold_versions()
    assert set(resumed.sources[1].leases) == {second}
    resumed.close()
    mixture.close()


def test_a_text_sources_bad_records_are_counted_and_said(tmp_path, caplog):
    """Records in = records trained + records rejected: every line that is not a JSON object, or has no
    text, is counted by reason and logged once per file (rank 0, its first reader), never dropped
    silently; the good records are those a plain reading of the file gives."""
    texts = factory.read_texts(limit=40)
    lines = [json.dumps({"text": t}) for t in texts]
    bad = ["{not json", "[1, 2]", '{"title": "no text"}', '{"text": null}', '{"text": 7}', '"a string"',
           '{"text": ""}', '{"text": " \\n\\t "}', '{"text": "caf\xe9 latin-1"}']
    for offset, line in enumerate(bad):
        lines.insert(4 * offset + 3, line)
    path = tmp_path / "mixed.jsonl"
    # One line in Latin-1, not UTF-8 (issue 75: it ended the run with a UnicodeDecodeError naming no file).
    path.write_bytes(("\n".join(lines) + "\n\n").encode("latin-1"))  # a blank line is no record
    source = TextSource(str(path), factory.tokenizer(), 64, batch_size=8, rank=0, world_size=1)
    caplog.set_level("WARNING", logger="maskstream.train")
    read = [text for _, text in source._texts([])]
    assert read == texts
    (message,) = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert f"{len(bad)} of {len(texts) + len(bad)} records rejected" in message
    assert "1 not JSON" in message and "2 not a JSON object" in message and "3 no text in 'text'" in message
    assert "2 empty document" in message and "1 not UTF-8" in message and str(path) in message
    assert f"trained on the other {len(texts)}" in message
    caplog.clear()  # another rank's reader says nothing: rank 0 said it
    other = TextSource(str(path), factory.tokenizer(), 64, batch_size=8, rank=1, world_size=2)
    assert [text for _, text in other._texts([])] == texts[1::2]
    assert not [r for r in caplog.records if "rejected" in r.getMessage()]


def test_a_text_source_without_a_mask_map_finds_words_by_the_builds_rule(text_file):
    """`--mix TEXT:WEIGHT:whole_word` (no mask map): the rows' word ids are the ones a version's mask map
    gives for the same text (maskstream's word rule, as the build stores them), so `whole_word` and `span`
    masks see the shards' words; the tokenizer's own `word_ids()` splits them differently on real text."""
    import pyarrow as pa

    from maskstream.mask_signal.mask_map import MaskMap
    from maskstream.mask_signal.words import words

    path, texts = text_file
    vocabulary = sorted({w for text in texts for w in words(text)})
    settings = {"budget": 0.15, "alpha": 1.0, "weighting": "similarity", "sharpness": 1.0, "floor": 0.0,
                "max_length": 128}
    mask_map = MaskMap.of_words(pa.array(vocabulary), np.arange(len(vocabulary)),
                                np.ones(len(vocabulary), np.float32), settings, factory.tokenizer_entry(), {"url": "t"})
    records = list(enumerate(texts))
    plain = TextSource(str(path), factory.tokenizer(), 128, batch_size=20, rank=0, world_size=1).samples(records)
    mapped = TextSource(str(path), factory.tokenizer(), 128, batch_size=20, rank=0, world_size=1,
                        mask_map=mask_map).samples(records)
    tokenizer = factory.tokenizer()
    differs = 0
    for text, without, with_map in zip(texts, plain, mapped, strict=True):
        assert np.array_equal(without["input_ids"], with_map["input_ids"])
        assert np.array_equal(without["word_ids"], with_map["word_ids"])
        assert not without["mask_probability"].any() and with_map["mask_probability"].any()
        own = tokenizer(text, truncation=True, max_length=128).word_ids()
        differs += not np.array_equal(without["word_ids"], [-1 if w is None else w for w in own])
    assert differs > 0  # e.g. "C++", "e-mail": one word here, several for the tokenizer

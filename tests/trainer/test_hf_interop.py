"""A version's shards in `datasets`, maskstream's masks in `transformers.Trainer`."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from maskstream.schemas.tables import SEQUENCE_SCHEMA
from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.hf import MaskingCollator, shard_urls
from maskstream.trainer.loader import build_dataloader
from maskstream.trainer.masking import MaskingConfig
from testing.sequence_dataset import read_texts, sequence_rows, write_dataset


def _check_rows(rows, urls: list[str]) -> None:
    expected = [pq.read_table(u) if not u.startswith("gs://") else None for u in urls]
    assert rows.column_names == SEQUENCE_SCHEMA.names
    if all(t is not None for t in expected):
        assert rows.num_rows == sum(t.num_rows for t in expected)
        first = expected[0].slice(0, 1).to_pylist()[0]
        assert rows[0]["input_ids"] == first["input_ids"]
        assert np.allclose(rows[0]["mask_probability"], first["mask_probability"])


def test_load_dataset_reads_a_local_version(local_dataset):
    from datasets import load_dataset

    urls = shard_urls(local_dataset)
    rows = load_dataset("parquet", data_files=urls, split="train")
    _check_rows(rows, urls)
    assert rows.num_rows == 400


@pytest.mark.slow
def test_load_dataset_reads_a_gcs_version(gcs_bucket, gcs_emulator):
    from datasets import load_dataset

    written = sequence_rows(read_texts(limit=30), max_length=64)
    write_dataset(f"{gcs_bucket}/dataset", written, shards=2, row_group_size=8)
    urls = shard_urls(f"{gcs_bucket}/dataset")
    assert all(u.startswith(f"{gcs_bucket}/dataset/v1/") for u in urls)
    rows = load_dataset("parquet", data_files=urls, split="train",
                        storage_options={"endpoint_url": gcs_emulator, "token": "anon"})
    assert rows.num_rows == 30
    assert [r["input_ids"] for r in rows] == [list(r["input_ids"]) for r in written]


def test_collator_draws_the_same_masks_as_the_trainer_loader(local_dataset):
    dataset = StreamingSequenceDataset(local_dataset, seed=3, shuffle=False)
    masking = MaskingConfig.from_manifest(dataset.manifest)
    dataset.set_epoch(2)
    loader_batch = next(iter(build_dataloader(dataset, batch_size=32, strategy="difference", masking=masking, seed=7)))
    samples = list(itertools.islice(StreamingSequenceDataset(local_dataset, seed=3, shuffle=False), 32))
    collator = MaskingCollator(dataset, "difference", seed=7)
    batch = collator(samples)
    assert sorted(batch) == ["attention_mask", "input_ids", "labels"]
    for name in batch:
        assert torch.equal(batch[name], loader_batch[name]), name
    # the masking rate is the build's budget of maskable tokens (15 %), within sampling noise
    maskable = collate_sequences(samples, 0)["special_tokens_mask"].logical_not() & batch["attention_mask"].bool()
    rate = (batch["labels"] != -100).sum().item() / maskable.sum().item()
    assert abs(rate - 0.15) < 0.02, rate


def test_unknown_strategy_is_refused(local_dataset):
    with pytest.raises(ValueError, match="unknown masking strategy"):
        MaskingCollator(StreamingSequenceDataset(local_dataset), "nonsense")


@pytest.mark.slow
def test_transformers_trainer_runs_the_documented_example(local_dataset, tiny_bert, tmp_path):
    """The module docstring's example, 5 steps: finite loss, and the weights reload with from_pretrained."""
    from transformers import AutoModelForMaskedLM, Trainer, TrainingArguments

    dataset = StreamingSequenceDataset(local_dataset, seed=0)
    model = AutoModelForMaskedLM.from_pretrained(tiny_bert)
    args = TrainingArguments(str(tmp_path / "hf"), max_steps=5, per_device_train_batch_size=16, report_to=[],
                             logging_steps=1, save_steps=5, use_cpu=True, learning_rate=1e-3,
                             remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=MaskingCollator(dataset, "difference"))
    result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 5 and all(math.isfinite(x) for x in losses) and math.isfinite(result.training_loss)
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path / "hf" / "checkpoint-5")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor.cpu(), reloaded.state_dict()[name]), name

"""`maskstream finetune` end to end on the shipped Debian sample (section: science/math/electronics)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from maskstream.cli import main
from maskstream.schemas.splits import hash_fraction
from maskstream.trainer import finetune
from maskstream.trainer.metrics import read_metrics


@pytest.fixture(scope="module")
def labeled_rows(sample_corpus):
    rows = [json.loads(line) for line in sample_corpus.read_text().splitlines()]
    rng = np.random.default_rng(0)
    return [rows[i] for i in rng.permutation(len(rows))]


@pytest.mark.slow
def test_finetune_with_tmr_and_class_weights_writes_model_evaluation_and_transfer(tmp_path, labeled_rows, minilm_path):
    from sklearn.metrics import accuracy_score, f1_score

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in labeled_rows[:60]) + '{"package": "x", "text": ""}\n')
    transfer = tmp_path / "transfer.parquet"  # another format, and a label the model never saw
    pq.write_table(pa.Table.from_pylist(labeled_rows[100:130] + [{"package": "y", "section": "games", "text": "a game"}]),
                   transfer)
    out = tmp_path / "out"
    assert main(["finetune", "--train", str(train), "--transfer", str(transfer), "--output", str(out),
                 "--model", minilm_path, "--label-column", "section", "--split-key", "package",
                 "--class-weights", "--epochs", "2", "--max-steps", "4", "--batch-size", "8",
                 "--max-length", "64", "--learning-rate", "1e-4"]) == 0

    evaluation = json.loads((out / "evaluation.json").read_text())
    labels = ["electronics", "math", "science"]
    assert evaluation["validation"]["labels"] == labels
    kept = [r for r in labeled_rows[:60] if hash_fraction(r["package"]) >= 0.2]
    counts = [sum(r["section"] == label for r in kept) for label in labels]
    assert list(evaluation["class_weights"].values()) == pytest.approx(finetune.class_weights(counts).tolist())
    validation_size = 60 - len(kept)
    assert evaluation["validation"]["examples"] == validation_size
    assert evaluation["transfer"]["examples"] == 30
    for split in ("validation", "transfer"):
        metrics = evaluation[split]
        assert 0 <= metrics["macro_f1"] <= 1 and set(metrics["per_class"]) == set(labels)
        assert np.asarray(metrics["confusion_matrix"]).sum() == metrics["examples"]
        assert (out / f"confusion-{split}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # Cross-check with scikit-learn on the (true, predicted) pairs the confusion matrix counts.
        pairs = [(t, p) for (t, p), n in np.ndenumerate(np.asarray(metrics["confusion_matrix"])) for _ in range(n)]
        y_true, y_pred = zip(*pairs, strict=True)
        assert metrics["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro", labels=[0, 1, 2],
                                                             zero_division=0))
        assert metrics["accuracy"] == pytest.approx(accuracy_score(y_true, y_pred))
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert {r["reason"] for r in rejects} == {"empty or non-text 'text'", "label 'games' does not occur in the training data"}
    records = read_metrics(out)
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3, 4]
    assert any(r["split"] == "validation" for r in records)
    assert (out / "model" / "config.json").exists() and (out / "model" / "tokenizer.json").exists()
    reloaded = json.loads((out / "model" / "config.json").read_text())
    assert reloaded["id2label"] == {"0": "electronics", "1": "math", "2": "science"}


@pytest.mark.slow
def test_tmr_masks_about_p_of_the_non_special_tokens_in_training_and_none_at_evaluation(labeled_rows, minilm_path):
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    # TMR acts on the inputs, whatever the model: a tiny BERT with MiniLM's vocabulary keeps this fast.
    model = BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64, num_labels=3))
    labels = ["electronics", "math", "science"]
    label_ids = {label: i for i, label in enumerate(labels)}
    rows = labeled_rows[:64]
    data = finetune.LabeledSet("rows", [r["text"] for r in rows], [r["section"] for r in rows],
                               [r["package"] for r in rows], [f"row {i}" for i in range(64)])
    samples = finetune.encode(tokenizer, data, label_ids, max_length=64)
    seen: list[tuple[bool, torch.Tensor, torch.Tensor]] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((module.training, kwargs["input_ids"].clone(),
                                                  kwargs["attention_mask"].clone())),
        with_kwargs=True)
    args = argparse.Namespace(batch_size=16, eval_batch_size=32, epochs=1, max_steps=0, learning_rate=1e-5,
                              weight_decay=0.0, warmup_ratio=0.0, max_grad_norm=1.0, seed=0, patience=1,
                              tmr_probability=0.1)

    class NoLog:
        def log(self, *a, **k):
            pass

    finetune.fit(model, tokenizer, samples, samples[:16], labels, args, None, NoLog())
    special = set(tokenizer.all_special_ids)
    masked = eligible = 0
    for training, input_ids, attention_mask in seen:
        if training:
            ids = input_ids[attention_mask.bool()]
            # [MASK] replaces tokens; everything else is a non-special token or [CLS]/[SEP].
            masked += int((ids == tokenizer.mask_token_id).sum())
            eligible += int(sum(int(t) not in special for t in ids)) + int((ids == tokenizer.mask_token_id).sum())
        else:
            assert not (input_ids == tokenizer.mask_token_id).any()  # evaluation inputs are never masked
    assert sum(training for training, _, _ in seen) == 4 and sum(not t for t, _, _ in seen) == 1
    # ~ 64 x 55 tokens: binomial standard deviation ~0.005, so +-0.02 is about 4 sigma.
    assert masked / eligible == pytest.approx(0.1, abs=0.02)

"""Fine-tuning parts checked against hand computations and scikit-learn."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from maskstream.schemas.splits import hash_fraction
from maskstream.trainer.finetune import class_weights, classification_metrics, read_labeled


def test_class_weights_match_the_written_formula_on_an_imbalanced_toy_set():
    labels = ["a"] * 6 + ["b"] * 3 + ["c"]  # N = 10, C = 3, N_c = 6, 3, 1
    counts = [labels.count(c) for c in "abc"]
    # By hand: s_c = sqrt(N / (C * N_c)) = sqrt(10/18), sqrt(10/9), sqrt(10/3)
    #               = 0.7453560, 1.0540926, 1.8257419;  sum = 3.6251905
    # w_c = C * s_c / sum = 2.2360680 / 3.6251905, 3.1622777 / 3.6251905, 5.4772256 / 3.6251905
    #     = 0.6168139, 0.8723066, 1.5108794
    expected = [0.6168139, 0.8723066, 1.5108794]
    np.testing.assert_allclose(class_weights(counts), expected, atol=1e-6)
    assert class_weights(counts).sum() == pytest.approx(3.0)  # they average 1
    assert class_weights([5, 5, 5]).tolist() == pytest.approx([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="positive count"):
        class_weights([3, 0])


def test_the_paper_typeset_normalization_gives_the_same_weighted_loss():
    # The paper typesets the normalization as s_c / (sum_k s_k * C): a constant factor C^2 away from
    # ours, which cancels in the weighted-mean cross-entropy.
    counts = np.array([6, 3, 1])
    s = np.sqrt(counts.sum() / (len(counts) * counts))
    typeset = s / (s.sum() * len(counts))
    logits = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([0] * 6 + [1] * 3 + [2])
    ours = torch.nn.functional.cross_entropy(logits, targets, weight=torch.tensor(class_weights(counts)).float())
    theirs = torch.nn.functional.cross_entropy(logits, targets, weight=torch.tensor(typeset).float())
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    unweighted = torch.nn.functional.cross_entropy(logits, targets)
    assert ours.item() != pytest.approx(unweighted.item(), rel=1e-3)


def test_classification_metrics_match_scikit_learn():
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

    rng = np.random.default_rng(3)
    y_true = rng.integers(0, 4, size=200)
    y_pred = np.where(rng.random(200) < 0.6, y_true, rng.integers(0, 3, size=200))  # class 3 never predicted
    names = ["w", "x", "y", "z"]
    metrics = classification_metrics(y_true, y_pred, names)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(y_true, y_pred))
    assert metrics["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro", labels=[0, 1, 2, 3],
                                                         zero_division=0))
    precision, recall, f1, support = precision_recall_fscore_support(y_true, y_pred, labels=[0, 1, 2, 3],
                                                                     zero_division=0)
    for i, name in enumerate(names):
        row = metrics["per_class"][name]
        assert (row["precision"], row["recall"], row["f1"], row["support"]) == pytest.approx(
            (precision[i], recall[i], f1[i], support[i]))
    assert metrics["confusion_matrix"] == confusion_matrix(y_true, y_pred, labels=[0, 1, 2, 3]).tolist()


def test_read_labeled_reads_every_format_and_rejects_bad_rows_with_a_reason(tmp_path):
    rows = [{"id": "p1", "body": "a text", "tag": "x"}, {"id": "p2", "body": "", "tag": "y"},
            {"id": "p3", "body": "more text", "tag": None}, {"id": "p4", "body": "last", "tag": 2}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]) + "{not json\n\n"
                                      + "".join(json.dumps(r) + "\n" for r in rows[2:]))
    pq.write_table(pa.Table.from_pylist([{**r, "tag": None if r["tag"] is None else str(r["tag"])} for r in rows]),
                   tmp_path / "d.parquet")
    (tmp_path / "d.csv").write_text("id,body,tag\np1,a text,x\np2,,y\np3,more text,\np4,last,2\n")
    for name, location in (("d.jsonl", "line"), ("d.parquet", "row"), ("d.csv", "row")):
        rejects: list[dict] = []
        data = read_labeled(str(tmp_path / name), "body", "tag", "id", rejects)
        assert data.texts == ["a text", "last"] and data.labels == ["x", "2"] and data.keys == ["p1", "p4"]
        expected = [(f"{location} 2", "empty or non-text 'body'"), (f"{location} 3", "missing 'tag'")]
        if name == "d.jsonl":  # the broken line is line 3 and the blank line 4 is skipped
            expected = [("line 2", "empty or non-text 'body'"), ("line 3", "not a JSON object"),
                        ("line 5", "missing 'tag'")]
        assert sorted((r["location"], r["reason"]) for r in rejects) == expected, name
    with pytest.raises(ValueError, match="no column 'label'"):
        read_labeled(str(tmp_path / "d.jsonl"), "body", "label", None, [])
    with pytest.raises(ValueError, match="unknown labeled-data format"):
        read_labeled(str(tmp_path / "d.txt"), "body", "tag", None, [])


@pytest.mark.slow
def test_read_labeled_from_gcs(gcs_bucket, sample_corpus):
    import fsspec

    url = f"{gcs_bucket}/labeled/debian.jsonl"
    with fsspec.open(url, "wb") as f:
        f.write(sample_corpus.read_bytes())
    data = read_labeled(url, "text", "section", "package", [])
    assert len(data.texts) == 2288 and set(data.labels) == {"science", "math", "electronics"}


def test_hash_split_depends_on_the_key_only():
    fractions = [hash_fraction(f"package-{i}") for i in range(5000)]
    assert all(0 <= f < 1 for f in fractions)
    assert sum(f < 0.2 for f in fractions) / 5000 == pytest.approx(0.2, abs=0.02)
    assert hash_fraction("freecad") == hash_fraction("freecad")

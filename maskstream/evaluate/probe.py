"""The readout: a deterministic probe on frozen features, predicted out of fold for every text.

Features: the model's last hidden states mean-pooled over every token of a text. A text longer than
the model's length is cut into windows of [CLS] + up to max_length - 2 tokens + [SEP]; each window is
mean-pooled over its tokens and the windows are averaged weighted by their token counts, so every
token counts and no position beyond those pretrained is used. The classifier: standardized features,
scikit-learn's LogisticRegression (lbfgs, balanced class weights); same features, same result.

Every text of an evaluation fold gets a prediction from a probe that did not see it: scikit-learn's
StratifiedGroupKFold over the fold's texts, grouped by near-duplicate cluster (a text's near-duplicates
never train the probe that predicts it), the same splits for every arm and seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

PRIMARY_METRIC = "macro_f1"


def features(model_dir: Path | str, texts: list[str], max_length: int, device: str, batch_size: int = 32
             ) -> np.ndarray:
    """(len(texts), hidden size) float64 features of the module docstring."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch
    import transformers
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    # a masked-LM checkpoint loaded as its encoder: transformers' report of the unused head is noise here
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        model = AutoModel.from_pretrained(str(model_dir), add_pooling_layer=False,
                                          dtype=torch.float32).to(device).eval()  # a 16-bit checkpoint too
    finally:
        transformers.logging.set_verbosity(verbosity)
    width = max_length - 2
    windows: list[tuple[int, list[int]]] = []  # (text index, window ids)
    for i, ids in enumerate(tokenizer(texts, add_special_tokens=False)["input_ids"]):
        for start in range(0, max(len(ids), 1), width):
            windows.append((i, [tokenizer.cls_token_id, *ids[start:start + width], tokenizer.sep_token_id]))
    order = sorted(range(len(windows)), key=lambda w: len(windows[w][1]))  # little padding per batch
    sums = np.zeros((len(texts), model.config.hidden_size))
    counts = np.zeros(len(texts))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = [windows[w] for w in order[start:start + batch_size]]
            longest = max(len(ids) for _, ids in chunk)
            ids = torch.full((len(chunk), longest), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), longest), dtype=torch.long)
            for row, (_, window) in enumerate(chunk):
                ids[row, :len(window)], mask[row, :len(window)] = torch.tensor(window), 1
            hidden = model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state.float().cpu()
            summed = (hidden * mask.unsqueeze(-1)).sum(1).double().numpy()
            for row, (text, _) in enumerate(chunk):
                sums[text] += summed[row]
                counts[text] += int(mask[row].sum())
    return sums / counts[:, None]


def fit_predict(train_x: np.ndarray, train_y: list[str], eval_x: np.ndarray, c: float, classes: list[str]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Fits the probe with inverse regularization `c`: the predicted labels of `eval_x`, and their class
    probabilities as columns of `classes` (0 for a class the training texts lack)."""
    # heavy: scikit-learn and SciPy load only where they are used
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(C=c, class_weight="balanced", max_iter=5000))
    probe.fit(train_x, train_y)
    probabilities = np.zeros((len(eval_x), len(classes)))
    probabilities[:, [classes.index(k) for k in probe.classes_]] = probe.predict_proba(eval_x)
    return probe.predict(eval_x), probabilities


def scores(y_true: list[str], y_pred: np.ndarray) -> dict[str, Any]:
    # heavy: scikit-learn and SciPy load only where they are used
    from sklearn.metrics import accuracy_score, f1_score

    return {"accuracy": float(accuracy_score(y_true, y_pred)),
            "macro_f1": float(f1_score(y_true, y_pred, average="macro")), "examples": len(y_true)}


def probe_splits(labels: list[str], groups: list[int], folds: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, predict) index pairs of the stratified group k-fold, fixed by its seed (0)."""
    # heavy: scikit-learn and SciPy load only where they are used
    from sklearn.model_selection import StratifiedGroupKFold

    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=0)
    return list(splitter.split(np.zeros(len(labels)), labels, groups))


def out_of_fold(x: np.ndarray, labels: list[str], splits: list[tuple[np.ndarray, np.ndarray]], c: float
                ) -> tuple[np.ndarray, dict[str, Any]]:
    """Each text's label predicted by the probe fitted on the other splits' texts, and its class
    probabilities (`{"labels": the classes, sorted, "values": one row per text}`): the true label's
    log-probability is a continuous per-text outcome beside the hard predictions."""
    predicted = np.empty(len(labels), dtype=object)
    y = np.asarray(labels, dtype=object)
    classes = sorted(set(labels))
    probabilities = np.zeros((len(labels), len(classes)))
    for train, held in splits:
        predicted[held], probabilities[held] = fit_predict(x[train], list(y[train]), x[held], c, classes)
    return predicted, {"labels": classes, "values": np.round(probabilities, 6).tolist()}


def choose_c(x: np.ndarray, labels: list[str], splits: list[tuple[np.ndarray, np.ndarray]], grid: list[float]
             ) -> tuple[float, list[dict[str, Any]]]:
    """The C of `grid` with the best out-of-fold macro-F1 (ties: the smaller C), and every C's scores."""
    table = [{"C": c, **scores(labels, out_of_fold(x, labels, splits, c)[0])} for c in sorted(grid)]
    best = max(table, key=lambda row: row[PRIMARY_METRIC])  # first max = smallest C among ties
    return best["C"], table

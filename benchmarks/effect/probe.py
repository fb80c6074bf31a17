"""The primary readout: a deterministic probe on frozen features.

Features: the model's last hidden states mean-pooled over every token of a text. A text longer than
the model's length is cut into windows of [CLS] + up to max_length - 2 tokens + [SEP]; each window is
mean-pooled over its tokens and the windows are averaged weighted by their token counts, so every
token counts and no position beyond those pretrained is used. The classifier: standardized features,
scikit-learn's LogisticRegression (lbfgs, balanced class weights); same features, same result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.effect.configs import PRIMARY_METRIC


def features(model_dir: Path | str, texts: list[str], max_length: int, device: str, batch_size: int = 32
             ) -> np.ndarray:
    """(len(texts), hidden size) float64 features of the module docstring."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir), add_pooling_layer=False).to(device).eval()
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


def fit_predict(train_x: np.ndarray, train_y: list[str], eval_x: dict[str, np.ndarray], c: float
                ) -> dict[str, np.ndarray]:
    """Fits the probe with inverse regularization `c`; predicted labels for each named feature set."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(C=c, class_weight="balanced", max_iter=5000))
    probe.fit(train_x, train_y)
    return {name: probe.predict(x) for name, x in eval_x.items()}


def scores(y_true: list[str], y_pred: np.ndarray) -> dict[str, Any]:
    from sklearn.metrics import accuracy_score, f1_score

    return {"accuracy": float(accuracy_score(y_true, y_pred)),
            "macro_f1": float(f1_score(y_true, y_pred, average="macro")), "examples": len(y_true)}


def choose_c(train_x: np.ndarray, train_y: list[str], val_x: np.ndarray, val_y: list[str], grid: list[float]
             ) -> tuple[float, list[dict[str, Any]]]:
    """The C of `grid` with the best validation macro-F1 (the primary metric; ties: the smaller C), and every
    C's scores."""
    table = []
    for c in sorted(grid):
        table.append({"C": c, **scores(val_y, fit_predict(train_x, train_y, {"v": val_x}, c)["v"])})
    best = max(table, key=lambda row: row[PRIMARY_METRIC])  # first max = smallest C among ties
    return best["C"], table

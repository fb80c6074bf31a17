"""Fine-tuning a sequence classifier (`maskstream finetune`): `finetune(FinetuneConfig)` reads the
labeled splits, trains with optional token-level masking regularization (TMR), keeps the best epoch
by validation macro-F1 and evaluates every split (maskstream/cli/finetune.py holds the command's help)."""

from __future__ import annotations

import csv
import json
import logging
import math
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from maskstream.mask_signal.alignment import word_ids_of_text
from maskstream.models import default_mlm, load_pretrained
from maskstream.schemas.splits import hash_fraction
from maskstream.trainer.config import check_ranges
from maskstream.trainer.metrics import MetricsLogger
from maskstream.trainer.optimizer import build_optimizer

log = logging.getLogger("maskstream.finetune")

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}


# --- labeled data -------------------------------------------------------------------------


@dataclass
class LabeledSet:
    """Rows kept from one labeled file: texts, their labels (as strings) and split keys."""

    source: str
    texts: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)  # "line N" (JSONL) or "row N", 1-based

    def subset(self, keep: list[bool]) -> LabeledSet:
        picked = [i for i, k in enumerate(keep) if k]
        return LabeledSet(
            self.source,
            [self.texts[i] for i in picked],
            [self.labels[i] for i in picked],
            [self.keys[i] for i in picked],
            [self.locations[i] for i in picked],
        )


def read_records(url: str, rejects: list[dict[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    """(location, record) for every record of a JSONL, Parquet or CSV file; JSONL lines that are not
    JSON objects go to `rejects`."""
    # heavy: this pyarrow module loads only when data is read: importing this module stays light
    import fsspec
    import pyarrow.csv
    import pyarrow.parquet

    suffix = posixpath.splitext(url.rstrip("/"))[1].lower()
    if suffix not in FORMATS:
        raise ValueError(f"{url}: unknown labeled-data format {suffix!r}; use one of {sorted(FORMATS)}")
    if FORMATS[suffix] == "jsonl":
        # Line by line, not pyarrow.json: one bad line or a label that is a number in some rows
        # and a string in others must cost that line, not the file.
        records = []
        with fsspec.open(url, "r", encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    record = None
                if isinstance(record, dict):
                    records.append((f"line {number}", record))
                else:
                    rejects.append({"source": url, "location": f"line {number}", "reason": "not a JSON object"})
        return records
    with fsspec.open(url, "rb") as f:
        if FORMATS[suffix] == "parquet":
            table = pyarrow.parquet.read_table(f)
        else:
            # Every column as text: labels like "01" keep their spelling, and empty cells stay "".
            names = next(csv.reader([f.readline().decode("utf-8-sig")]), [])
            f.seek(0)
            table = pyarrow.csv.read_csv(
                f, convert_options=pyarrow.csv.ConvertOptions(column_types={n: pyarrow.string() for n in names},
                                                              strings_can_be_null=True))
    return [(f"row {number}", record) for number, record in enumerate(table.to_pylist(), start=1)]


def read_labeled(url: str, text_column: str, label_column: str, split_key: str | None,
                 rejects: list[dict[str, str]]) -> LabeledSet:
    """Reads a labeled file; records with an empty text or a missing label go to `rejects`."""
    records = read_records(url, rejects)
    key_column = split_key or text_column
    if records:
        present = set().union(*(record.keys() for _, record in records))
        for column in (text_column, label_column, key_column):
            if column not in present:
                raise ValueError(f"{url}: no column {column!r}; it has {sorted(present)}")
    data = LabeledSet(url)
    for location, record in records:
        text, label = record.get(text_column), record.get(label_column)
        if not isinstance(text, str) or not text.strip():
            rejects.append({"source": url, "location": location, "reason": f"empty or non-text {text_column!r}"})
        elif label is None or str(label).strip() == "":
            rejects.append({"source": url, "location": location, "reason": f"missing {label_column!r}"})
        else:
            data.texts.append(text)
            data.labels.append(str(label))
            data.keys.append(str(record.get(key_column)))
            data.locations.append(location)
    return data


def drop_unknown_labels(data: LabeledSet, label_ids: dict[str, int], rejects: list[dict[str, str]]) -> LabeledSet:
    known = [label in label_ids for label in data.labels]
    for location, label, ok in zip(data.locations, data.labels, known, strict=True):
        if not ok:
            rejects.append({"source": data.source, "location": location,
                            "reason": f"label {label!r} does not occur in the training data"})
    return data.subset(known)


# --- class weights and metrics --------------------------------------------------------------


def class_weights(counts: list[int] | np.ndarray) -> np.ndarray:
    """The TMR paper's adaptive inverse-frequency weights, normalized to average 1:

        s_c = sqrt(N / (C * N_c)),   w_c = C * s_c / sum_k s_k

    with N the number of training examples, C the number of classes and N_c those of class c.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or len(counts) == 0 or (counts <= 0).any():
        raise ValueError(f"class weights need a positive count for every class, got {counts.tolist()}")
    total, num_classes = counts.sum(), len(counts)
    s = np.sqrt(total / (num_classes * counts))
    return num_classes * s / s.sum()


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, label_names: list[str]) -> dict[str, Any]:
    """Accuracy, macro-F1 over all classes, per-class precision/recall/F1/support, confusion matrix
    (rows: true class, columns: predicted). An undefined precision or recall counts as 0."""
    num_classes = len(label_names)
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (np.asarray(y_true), np.asarray(y_pred)), 1)
    true_positives = np.diag(confusion).astype(np.float64)
    predicted, support = confusion.sum(axis=0), confusion.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, true_positives / predicted, 0.0)
        recall = np.where(support > 0, true_positives / support, 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    return {
        "examples": int(confusion.sum()),
        "accuracy": float(true_positives.sum() / max(confusion.sum(), 1)),
        "macro_f1": float(f1.mean()),
        "per_class": {
            name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for name, p, r, f, s in zip(label_names, precision, recall, f1, support, strict=True)
        },
        "confusion_matrix": confusion.tolist(),
        "labels": list(label_names),
    }


def format_report(name: str, metrics: dict[str, Any]) -> str:
    lines = [f"{name}: {metrics['examples']} examples, accuracy {metrics['accuracy']:.4f}, "
             f"macro-F1 {metrics['macro_f1']:.4f}",
             f"  {'class':<20} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}"]
    for label, row in metrics["per_class"].items():
        lines.append(f"  {label:<20} {row['precision']:>9.4f} {row['recall']:>9.4f} {row['f1']:>9.4f} "
                     f"{row['support']:>8d}")
    return "\n".join(lines)


def plot_confusion(metrics: dict[str, Any], title: str, path: Path) -> None:
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib

    matplotlib.use("Agg")
    # heavy: matplotlib loads only when a figure is drawn
    import matplotlib.pyplot as plt

    confusion = np.asarray(metrics["confusion_matrix"])
    labels = metrics["labels"]
    size = 2.5 + 0.6 * len(labels)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(confusion, cmap="Blues")
    fig.colorbar(image, ax=ax)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"{title}\naccuracy {metrics['accuracy']:.3f}, macro-F1 {metrics['macro_f1']:.3f}", fontsize=10)
    threshold = confusion.max() / 2 if confusion.size else 0
    for (i, j), count in np.ndenumerate(confusion):
        ax.text(j, i, str(count), ha="center", va="center", color="white" if count > threshold else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- batches --------------------------------------------------------------------------------


def encode(tokenizer, data: LabeledSet, label_ids: dict[str, int], max_length: int) -> list[dict[str, np.ndarray]]:
    """One sample per row, in the shape `collate_sequences` takes, plus its label. Word ids follow
    the build's rule (`maskstream.mask_signal.alignment`), not the tokenizer's `word_ids()` (its pre-tokenizer's
    pieces: whitespace runs for SentencePiece tokenizers)."""

    encoded = tokenizer(data.texts, truncation=True, max_length=max_length, return_special_tokens_mask=True,
                        return_offsets_mapping=True)
    samples = []
    for index, (ids, special, offsets, label) in enumerate(
        zip(encoded["input_ids"], encoded["special_tokens_mask"], encoded["offset_mapping"], data.labels, strict=True)
    ):
        samples.append({
            "input_ids": np.asarray(ids, dtype=np.int32),
            "special_tokens_mask": np.asarray(special, dtype=np.int8),
            "word_ids": word_ids_of_text(data.texts[index], offsets, special),
            "mask_probability": np.zeros(len(ids), dtype=np.float32),
            "sample_index": index,
            "label": label_ids[label],
        })
    return samples


def batches(samples: list[dict[str, Any]], batch_size: int, pad_token_id: int, shuffle_seed: int | None):
    """Padded tensor batches (`collate_sequences`) with `class_labels`; shuffled when a seed is given.
    (`labels` is what masking adds: the MLM targets.)"""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch

    # heavy: imports torch; only here, where it is needed
    from maskstream.trainer.collate import collate_sequences

    order = np.arange(len(samples))
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(len(samples))
    for start in range(0, len(order), batch_size):
        chunk = [samples[i] for i in order[start:start + batch_size]]
        batch = collate_sequences(chunk, pad_token_id=pad_token_id)
        batch["class_labels"] = torch.tensor([s["label"] for s in chunk], dtype=torch.long)
        yield batch


# --- training and evaluation ---------------------------------------------------------------


def predict(model, samples: list[dict[str, Any]], batch_size: int, pad_token_id: int, device) -> np.ndarray:
    """Predicted class per sample. Inputs are never masked here: TMR is a training-time perturbation."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch

    model.eval()
    predictions = []
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        for batch in batches(samples, batch_size, pad_token_id, shuffle_seed=None):
            logits = model(input_ids=batch["input_ids"].to(device),
                           attention_mask=batch["attention_mask"].to(device)).logits
            predictions.append(logits.argmax(-1).cpu().numpy())
    return np.concatenate(predictions) if predictions else np.zeros(0, dtype=np.int64)


@dataclass
class FinetuneConfig:
    """The settings of one `maskstream finetune` run: the CLI flags (see `add_arguments`), checked on
    construction."""

    train: str
    output: str
    validation: str | None = None
    test: str | None = None
    transfer: str | None = None
    model: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    split_key: str | None = None
    validation_fraction: float = 0.2
    tmr_probability: float = 0.1
    class_weights: bool = False
    epochs: int = 3
    patience: int = 2
    batch_size: int = 16
    eval_batch_size: int = 64
    max_length: int = 128
    learning_rate: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    max_steps: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges(("--tmr-probability", self.tmr_probability, 0 <= self.tmr_probability < 1),
                     ("--validation-fraction", self.validation_fraction, 0 < self.validation_fraction < 1),
                     ("--epochs", self.epochs, self.epochs >= 1),
                     ("--patience", self.patience, self.patience >= 1),
                     ("--batch-size", self.batch_size, self.batch_size >= 1),
                     ("--eval-batch-size", self.eval_batch_size, self.eval_batch_size >= 1),
                     ("--max-steps", self.max_steps, self.max_steps >= 0))



def train_epoch(model, samples, epoch: int, step: int, total_steps: int, config: FinetuneConfig, pad_token_id: int,
                tmr, loss_weights, optimizer, scheduler, logger, progress) -> int:
    """One pass over `samples` (shuffled per epoch), TMR-masked, stopping at `total_steps`; returns the step."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch

    # heavy: imports torch; only here, where it is needed
    from maskstream.trainer.masking import apply_masking

    device = next(model.parameters()).device
    model.train()
    for batch in batches(samples, config.batch_size, pad_token_id, shuffle_seed=config.seed * 1_000_003 + epoch):
        if step >= total_steps:
            break
        if tmr is not None:
            batch = apply_masking(batch, "tmr", tmr, seed=config.seed, epoch=epoch)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=batch["input_ids"].to(device),
                           attention_mask=batch["attention_mask"].to(device)).logits
        loss = torch.nn.functional.cross_entropy(logits.float(), batch["class_labels"].to(device),
                                                 weight=loss_weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        progress.update(1)
        logger.log(step, "train", {"loss": loss.item(), "learning_rate": scheduler.get_last_lr()[0], "epoch": epoch})
    return step


def fit(model, tokenizer, train_samples, validation_samples, label_names: list[str], config: FinetuneConfig,
        weights: np.ndarray | None, logger) -> dict[str, Any]:
    """Trains with TMR and early stopping on validation macro-F1; leaves the best weights in `model`
    and returns the best validation metrics (with `epoch`)."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch
    from tqdm import tqdm

    # heavy: imports torch; only here, where it is needed
    from maskstream.trainer.masking import MaskingConfig

    device = next(model.parameters()).device
    total_steps = math.ceil(len(train_samples) / config.batch_size) * config.epochs
    if config.max_steps > 0:
        total_steps = min(total_steps, config.max_steps)
    optimizer, scheduler = build_optimizer(model, config.weight_decay, config.learning_rate,
                                           math.ceil(config.warmup_ratio * total_steps), total_steps)
    loss_weights = None if weights is None else torch.tensor(weights, dtype=torch.float32, device=device)
    tmr = MaskingConfig.from_tokenizer(tokenizer, tmr_probability=config.tmr_probability) \
        if config.tmr_probability > 0 else None
    pad = tokenizer.pad_token_id
    validation_labels = np.array([s["label"] for s in validation_samples])

    best: dict[str, Any] = {"macro_f1": -1.0}
    best_state = None
    epochs_without_gain, step = 0, 0
    progress = tqdm(total=total_steps, desc="finetune", unit="step")
    for epoch in range(config.epochs):
        step = train_epoch(model, train_samples, epoch, step, total_steps, config, pad, tmr, loss_weights,
                           optimizer, scheduler, logger, progress)
        predictions = predict(model, validation_samples, config.eval_batch_size, pad, device)
        metrics = classification_metrics(validation_labels, predictions, label_names)
        logger.log(step, "validation", {"accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"],
                                        "epoch": epoch})
        log.info("epoch %d (step %d): validation accuracy %.4f, macro-F1 %.4f", epoch, step,
                 metrics["accuracy"], metrics["macro_f1"])
        if metrics["macro_f1"] > best["macro_f1"]:
            best, epochs_without_gain = {**metrics, "epoch": epoch, "step": step}, 0
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        else:
            epochs_without_gain += 1
            if epochs_without_gain >= config.patience:
                log.info("early stopping: no better validation macro-F1 for %d epochs", config.patience)
                break
        if step >= total_steps:
            break
    progress.close()
    if best_state is not None:
        model.load_state_dict(best_state)
    return best


def read_splits(config: FinetuneConfig, rejects: list[dict[str, str]]) -> tuple[dict[str, LabeledSet], list[str]]:
    """(labeled sets by split, label names): train, validation (a hashed share of --train unless
    --validation names a file), and test and transfer when given; rows of the last three whose label
    does not occur in train are rejected."""
    def read(url: str) -> LabeledSet:
        return read_labeled(url, config.text_column, config.label_column, config.split_key, rejects)

    train = read(config.train)
    if config.validation:
        validation = read(config.validation)
    else:
        in_validation = [hash_fraction(k) < config.validation_fraction for k in train.keys]
        train, validation = train.subset([not v for v in in_validation]), train.subset(in_validation)
    if not train.texts or not validation.texts:
        raise SystemExit(f"need training and validation rows; got {len(train.texts)} and "
                         f"{len(validation.texts)} (see {Path(config.output) / 'rejects.jsonl'})")
    label_names = sorted(set(train.labels))
    if len(label_names) < 2:
        raise SystemExit(f"need at least two labels in {config.train}, found {label_names}")
    label_ids = {label: i for i, label in enumerate(label_names)}
    splits = {"train": train, "validation": drop_unknown_labels(validation, label_ids, rejects)}
    for split in ("test", "transfer"):
        url = getattr(config, split)
        if url:
            splits[split] = drop_unknown_labels(read(url), label_ids, rejects)
    return splits, label_names


def load_classifier(config: FinetuneConfig, label_names: list[str]):
    """(tokenizer, model): --model with a new classification head for `label_names`, on the device."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model_name = config.model or default_mlm()
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    model, _ = load_pretrained(AutoModelForSequenceClassification, model_name, "classification head",
                               "expected when fine-tuning", num_labels=len(label_names),
                               id2label=dict(enumerate(label_names)),
                               label2id={label: i for i, label in enumerate(label_names)})
    model.to(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    return tokenizer, model


def evaluate_splits(model, tokenizer, encoded: dict[str, list[dict[str, Any]]], label_names: list[str],
                    config: FinetuneConfig, best: dict[str, Any], logger) -> dict[str, Any]:
    """Each split but train with the best model: metrics, per-example predictions (in the split's row
    order, for paired tests between runs) and a confusion-matrix PNG."""
    out = Path(config.output)
    device = next(model.parameters()).device
    evaluation: dict[str, Any] = {}
    for split, samples in encoded.items():
        if split == "train":
            continue
        predictions = predict(model, samples, config.eval_batch_size, tokenizer.pad_token_id, device)
        metrics = classification_metrics(np.array([s["label"] for s in samples], dtype=np.int64), predictions,
                                         label_names)
        evaluation[split] = {**metrics, "predictions": predictions.tolist()}
        plot_confusion(metrics, split, out / f"confusion-{split}.png")
        logger.log(best["step"], f"final_{split}", {"accuracy": metrics["accuracy"],
                                                    "macro_f1": metrics["macro_f1"]})
        log.info("%s", format_report(split + (" (zero-shot)" if split == "transfer" else ""), metrics))
    return evaluation


def finetune(config: FinetuneConfig) -> int:
    """Reads the splits, fits the classifier (best epoch by validation macro-F1), evaluates every split,
    and writes model/, evaluation.json, confusion-*.png, metrics.jsonl and rejects.jsonl into the output."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    import torch

    torch.manual_seed(config.seed)
    out = Path(config.output)
    out.mkdir(parents=True, exist_ok=True)
    rejects: list[dict[str, str]] = []
    splits, label_names = read_splits(config, rejects)
    label_ids = {label: i for i, label in enumerate(label_names)}
    counts = np.bincount([label_ids[label] for label in splits["train"].labels], minlength=len(label_names))
    weights = class_weights(counts) if config.class_weights else None
    log.info("training examples per label: %s", dict(zip(label_names, counts.tolist(), strict=True)))
    if weights is not None:
        log.info("class weights: %s", {name: round(w, 4) for name, w in zip(label_names, weights.tolist(), strict=True)})

    tokenizer, model = load_classifier(config, label_names)
    encoded = {split: encode(tokenizer, data, label_ids, config.max_length) for split, data in splits.items()}
    log.info("rows: %s; rejected %d", {k: len(v) for k, v in encoded.items()}, len(rejects))

    logger = MetricsLogger(out)
    best = fit(model, tokenizer, encoded["train"], encoded["validation"], label_names, config, weights, logger)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    evaluation = {"best_epoch": best["epoch"], "best_step": best["step"],
                  "class_weights": None if weights is None else dict(zip(label_names, weights.tolist(), strict=True)),
                  "tmr_probability": config.tmr_probability, "rejected_rows": len(rejects),
                  **evaluate_splits(model, tokenizer, encoded, label_names, config, best, logger)}
    logger.close()
    (out / "evaluation.json").write_text(json.dumps(evaluation, indent=2) + "\n", encoding="utf-8")
    with (out / "rejects.jsonl").open("w", encoding="utf-8") as f:
        for reject in rejects:
            f.write(json.dumps(reject) + "\n")
    log.info("wrote %s (model/, evaluation.json, confusion-*.png, metrics.jsonl)", out)
    return 0

"""Fine-tune a (continued-pretrained) encoder for sequence classification and evaluate it.

Reads labeled data (JSONL, Parquet or CSV; local paths or gs://) with configurable text and
label columns, starts from a `maskstream train` output or any model name or path, and trains
with Token Masking Regularization (TMR: each non-special input token becomes [MASK] with
probability p during training only; evaluation sees the inputs unmasked) and optionally the
TMR paper's class weights. Early stopping on validation macro-F1; the best model is written
with its tokenizer. Evaluation reports accuracy, macro-F1, a per-class report and a
confusion-matrix PNG for the validation set, the test set and a transfer set (zero-shot:
evaluated without training on it) when given.

Validation split when --validation is not given: a row goes to validation when
sha256(its --split-key value) read as a number in [0, 1) is below --validation-fraction,
so the split depends on the key only, not on file order or the machine.

Outputs in --output: model/ (save_pretrained + tokenizer), metrics.jsonl, tensorboard/,
evaluation.json, confusion-SPLIT.png, rejects.jsonl (rows not used, with the reason).
"""

from __future__ import annotations

import argparse

from maskstream.cli.config import config_of
from maskstream.trainer.finetune import FinetuneConfig, finetune


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train", required=True, help="labeled training data: .jsonl, .parquet or .csv, local or gs://")
    parser.add_argument("--validation", default=None,
                        help="labeled validation data (default: a hashed split of --train, see --validation-fraction)")
    parser.add_argument("--test", default=None, help="labeled test data, evaluated with the best model (default: none)")
    parser.add_argument("--transfer", default=None,
                        help="a second labeled set (same labels, another domain or language) evaluated zero-shot "
                             "(default: none)")
    parser.add_argument("--output", required=True, help="output folder")
    parser.add_argument("--model", default=None,
                        help="a `maskstream train` output, or any model name or path (default: the general-English "
                             "masked LM shipped with maskstream)")
    parser.add_argument("--text-column", default="text", help="column holding the text (default: text)")
    parser.add_argument("--label-column", default="label", help="column holding the label (default: label)")
    parser.add_argument("--split-key", default=None,
                        help="column hashed for the validation split, e.g. an id (default: the text column)")
    parser.add_argument("--validation-fraction", type=float, default=0.2,
                        help="share of --train held out for validation when --validation is not given (default: 0.2)")
    parser.add_argument("--tmr-probability", type=float, default=0.1,
                        help="Token Masking Regularization probability p; 0 turns it off (default: 0.1)")
    parser.add_argument("--class-weights", action="store_true",
                        help="weight the loss by the TMR paper's class weights (see docs/training.md; default: off)")
    parser.add_argument("--epochs", type=int, default=3, help="maximum number of epochs (default: 3)")
    parser.add_argument("--patience", type=int, default=2,
                        help="stop after this many epochs without a better validation macro-F1 (default: 2)")
    parser.add_argument("--batch-size", type=int, default=16, help="batch size (default: 16)")
    parser.add_argument("--eval-batch-size", type=int, default=64, help="evaluation batch size (default: 64)")
    parser.add_argument("--max-length", type=int, default=128, help="truncate texts to this many tokens (default: 128)")
    parser.add_argument("--learning-rate", type=float, default=5e-5, help="peak learning rate (default: 5e-5)")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default: 0.01)")
    parser.add_argument("--warmup-ratio", type=float, default=0.1,
                        help="share of the steps with linear warm-up (default: 0.1)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (default: 1.0)")
    parser.add_argument("--max-steps", type=int, default=0,
                        help="stop training after this many optimizer steps, 0 for no limit (default: 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed for initialization, shuffling and TMR (default: 0)")


def run(args: argparse.Namespace) -> int:
    return finetune(config_of(FinetuneConfig, args))

"""Continued MLM pretraining on a maskstream dataset, streamed from disk or gs://.

Loads a masked-LM from a model name or path (by default the general-English masked LM shipped with
maskstream, `maskstream/english_mlm/`: 4 layers x 256, MiniLM's vocabulary, so a dataset built at the
defaults trains it; a model without an MLM head, like a sentence encoder, gets a new head whose decoder
is tied to the input embeddings, and the log says which weights are new), streams the dataset's shards,
draws a fresh mask per epoch with any strategy (`difference`, drawn from the dataset's stored mask
probabilities, by default), and trains with
AdamW, linear warm-up then linear decay, gradient accumulation and clipping, bf16 autocast
on CUDA and optionally torch.compile. Several GPUs: launch with `torchrun`; each rank reads
its own share of the rows. Masks are drawn in the loader workers, on a GPU too, so that the training
process only moves each batch; with a --mask-budget-schedule other than constant or with --mix, after
the transfer, in the training process, where the step and so its budget are known.

Held-out split: a row is held out (never trained on) when the top 24 bits of (its sample
index x 0x9E3779B97F4A7C15 mod 2^64), read as a number in [0, 1), fall below
--held-out-fraction: the same rows for every run, rank count and strategy. Evaluation masks the
first --eval-samples held-out rows in dataset order with --eval-strategy (`random` by default,
whatever the training strategy), the default budget (15%, 80/10/10) and a fixed seed, so loss,
perplexity and masked-token accuracy are comparable between runs and strategies.

Outputs in --output: checkpoints/ (every --save-every steps and at the end; `--resume`
continues from the newest: exactly with the same ranks, workers and batch size; with others, the
rest of the epoch, every sample once, in the global order: docs/masking.md), metrics.jsonl and tensorboard/ (loss, masked-token
accuracy, learning rate, the step's mask budget, tokens/s, data-wait share; held-out loss, perplexity, accuracy),
summary.json, and model/ (save_pretrained + tokenizer: what `maskstream finetune` starts from).
"""

from __future__ import annotations

import argparse

from maskstream.cli.config import config_of
from maskstream.trainer.config import TrainConfig
from maskstream.trainer.strategies import PRETRAINING_STRATEGIES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset root or version folder (local or gs://)")
    parser.add_argument("--output", required=True, help="output folder (checkpoints, logs, final model)")
    parser.add_argument("--model", default=None,
                        help="masked-LM name or path; its tokenizer must be the dataset's (default: the general-English "
                             "masked LM shipped with maskstream, which reads the MiniLM vocabulary `build` uses)")
    parser.add_argument("--objective", default="mlm",
                        help="training objective, a name in maskstream.trainer.objectives.OBJECTIVES (default: mlm)")
    parser.add_argument("--exlm-states", type=int, default=4,
                        help="with --objective exlm: [MASK] states per masked token, k (default: 4)")
    parser.add_argument("--exlm-token-budget", type=int, default=0,
                        help="with --objective exlm: most expanded tokens per forward pass; a larger batch runs "
                             "in checkpointed chunks, same loss and gradients (default: 0, no limit)")
    parser.add_argument("--strategy", default="difference", choices=PRETRAINING_STRATEGIES,
                        help="masking strategy; `difference` draws from the dataset's mask probabilities "
                             "(default: difference)")
    parser.add_argument("--whole-word", action="store_true",
                        help="with --strategy difference, mask whole words (default: off)")
    parser.add_argument("--mask-budget", type=float, default=0.15, help="share of tokens masked (default: 0.15)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="keep the dataset's shards in DIR (for a gs:// dataset: read from the bucket once): the "
                             "next two downloaded ahead, checked by sha256, least recently used evicted (default: no "
                             "cache)")
    parser.add_argument("--cache-limit", type=int, default=0, metavar="BYTES",
                        help="the most --cache-dir may hold, in bytes (required with --cache-dir)")
    parser.add_argument("--mask-budget-schedule", default="constant", metavar="SCHEDULE",
                        help="the budget over the run's steps: constant (--mask-budget), linear:START:END or "
                             "cosine:START:END, e.g. linear:0.3:0.15 (Ankner et al. 2023); every strategy follows "
                             "it, the step's budget is logged (default: constant)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per batch per device (default: 32)")
    parser.add_argument("--grad-accumulation", type=int, default=1,
                        help="batches per optimizer step (default: 1)")
    parser.add_argument("--epochs", type=float, default=1.0,
                        help="passes over the data when --max-steps is 0; a resume on another layout still ends them (default: 1)")
    parser.add_argument("--max-steps", type=int, default=0,
                        help="optimizer steps to run; 0 derives them from --epochs (default: 0)")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="peak learning rate (default: 1e-4)")
    parser.add_argument("--weight-decay", type=float, default=0.01,
                        help="AdamW weight decay, not applied to biases and norms (default: 0.01)")
    parser.add_argument("--warmup-ratio", type=float, default=0.06,
                        help="warm-up steps as a share of all steps (default: 0.06)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (default: 1.0)")
    parser.add_argument("--seed", type=int, default=0, help="seed for shuffling, masks and initialization (default: 0)")
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes (default: 2)")
    parser.add_argument("--held-out-fraction", type=float, default=0.02,
                        help="share of rows held out for evaluation, never trained on (default: 0.02)")
    parser.add_argument("--eval-samples", type=int, default=512,
                        help="held-out rows evaluated, the first in dataset order (default: 512)")
    parser.add_argument("--eval-strategy", default="random", choices=PRETRAINING_STRATEGIES,
                        help="masking of the held-out rows, same for every run (default: random)")
    parser.add_argument("--eval-every", type=int, default=500, help="evaluate every N steps and at the end (default: 500)")
    parser.add_argument("--log-every", type=int, default=10, help="log training metrics every N steps (default: 10)")
    parser.add_argument("--save-every", type=int, default=1000,
                        help="write a checkpoint every N steps and at the end (default: 1000)")
    parser.add_argument("--resume", nargs="?", const="latest", default=None,
                        help="continue from a checkpoint folder, or with no value from the newest in "
                             "OUTPUT/checkpoints (default: start fresh)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (default: off)")
    parser.add_argument("--follow-latest", action="store_true",
                        help="at each epoch boundary move on to the newest complete version of the dataset root "
                             "(--dataset, or the root holding the version it names) when its tokenizer matches; "
                             "logs the switch and the seeds that changed; with --mix, every maskstream source's root "
                             "is followed and each rank moves on at its own epoch boundary of the source "
                             "(default: off)")
    parser.add_argument("--mix", action="append", default=None, metavar="SOURCE:WEIGHT[:STRATEGY]",
                        help="also train on SOURCE, WEIGHT (0-1) of the samples, the domain (--dataset) taking the "
                             "rest; repeatable. SOURCE: a maskstream dataset (root or version), or .jsonl/.parquet "
                             "text (file, folder or glob; a `text` field) tokenized on the fly. The domain is masked "
                             "with --strategy, a SOURCE with STRATEGY (default: random); difference masking of text "
                             "applies the domain version's mask map as it is read (default: the domain alone)")
    parser.add_argument("--sample-log", default=None, metavar="FILE",
                        help="append one JSON line per sample trained (epoch, source, sample_index, step, rank) to "
                             "FILE, every rank to the same file: what a run and its resumes trained (default: off)")


def run(args: argparse.Namespace) -> int:
    # heavy (torch, transformers): loaded when the command runs, not for `maskstream --help`
    from maskstream.trainer.train import train

    return train(config_of(TrainConfig, args))

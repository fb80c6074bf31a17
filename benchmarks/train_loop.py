"""`maskstream train` itself against the same step on a batch that never leaves the device (issue 59).

    python -m benchmarks.train_loop                                  # CPU: a tiny BERT, that it all runs
    python -m benchmarks.train_loop --device cuda                    # the GPU table: see below

The product: `train(TrainConfig)`, the function `maskstream train` calls, with the config built by the
CLI's own parser from `--dataset D --output O --model M --batch-size 64 --max-steps N --num-workers W`
(and `--compile` where the row says so); every other flag at its CLI default: difference masking drawn
in the loader workers, held-out fraction 0.02, 512 held-out rows evaluated before and after training
(the loop leaves evaluation out of its windows' time), logs every 10 steps. Its samples/s and
data_wait_share are the medians of the run's own metrics.jsonl windows, the first two left out
(loader workers starting, compilation): hence --steps 30 at least. It runs on --device (its own choice
is CUDA wherever torch has it) and without its progress bar.

The ceiling: the same model in the same objective (`MaskedLM`), AdamW as the trainer builds it, bf16
autocast on CUDA, gradient clipping, on one batch of the loader's (masked, with its masked positions,
its held-out rows dropped as the product's are) moved to --device once; timed from a synchronize to a
synchronize after warm-up steps. Both sides count the rows they train, held-out rows not among them.

Rows: the shipped corpus's descriptions in groups of 4, cut to exactly 128 tokens (as
`benchmarks/masking.py`), repeated to --rows (20,480 by default) with their own sample indices.

Models (`--device cuda`): a BERT-base-sized masked LM from transformers' `BertConfig` defaults (110 M
parameters, random weights, MiniLM's vocabulary; no download), without --compile; and the offline
MiniLM (`build`'s default encoder, a sentence encoder given a new MLM head) with --compile. Worker counts 2
and 4. On the CPU, a 2-layer BERT
checks the script: the two sides run the same CPU step, so the ratio says nothing there.

`data_wait_share` after issue 59: the share of the window the training process spent in
`next(batches)` and queuing the batch's copy to the device. The step no longer waits for the device
(tests/trainer/test_train_transfer.py), so on a GPU this is time the host could not queue work: when
the GPU has work queued it is hidden, and the ratio to the ceiling is the figure that counts.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

from benchmarks.masking import real_sequences
from maskstream.cli.config import config_of
from maskstream.cli.train import add_arguments
from maskstream.models import default_model
from maskstream.trainer import train as train_loop
from maskstream.trainer.config import TrainConfig
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.loader import MASKED_POSITIONS, ROWS_READ, build_dataloader
from maskstream.trainer.masking import MaskingConfig
from maskstream.trainer.metrics import read_metrics
from maskstream.trainer.objectives import OBJECTIVES, load_mlm_model
from maskstream.trainer.optimizer import adamw
from maskstream.trainer.world import World
from testing import sequence_dataset as factory

REPO = Path(__file__).resolve().parents[1]
BATCH = 64
SKIPPED_WINDOWS = 2  # the product's first metrics windows, left out of its medians


def write_rows(root: Path, count: int) -> str:
    """A dataset version of `count` rows of exactly 128 tokens (real text, repeated)."""
    rows, _ = real_sequences(REPO / "data" / "debian-science.jsonl")
    tiled = [rows[i % len(rows)] for i in range(count)]
    factory.write_dataset(str(root), tiled, shards=8, row_group_size=2048)
    return str(root)


def save_model(kind: str, folder: Path) -> str:
    """A model path: `bert-base` (BertConfig defaults) or `tiny` (2 layers, 64 wide), with MiniLM's
    tokenizer; `minilm` is the offline MiniLM itself."""
    if kind == "minilm":
        return default_model()
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(default_model())
    sizes = {} if kind == "bert-base" else {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                                             "intermediate_size": 128}
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), **sizes)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def cli_config(dataset: str, output: Path, model: str, steps: int, workers: int, compile_model: bool) -> TrainConfig:
    """The TrainConfig `maskstream train` builds from these flags, every other one at its default."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--dataset", dataset, "--output", str(output), "--model", model, "--batch-size", str(BATCH),
            "--max-steps", str(steps), "--num-workers", str(workers)] + (["--compile"] if compile_model else [])
    return config_of(TrainConfig, parser.parse_args(argv))


def product(config: TrainConfig, device: torch.device) -> tuple[float, float]:
    """(samples/s, data_wait_share) of `train(config)` on `device`: medians of its windows after the first
    SKIPPED_WINDOWS. Its samples are the rows it trained."""
    with on_device_quietly(device):
        train_loop.train(config)
    windows = [r for r in read_metrics(config.output) if r["split"] == "train"][SKIPPED_WINDOWS:]
    return (statistics.median(r["samples_per_second"] for r in windows),
            statistics.median(r["data_wait_share"] for r in windows))


@contextlib.contextmanager
def on_device_quietly(device: torch.device):
    """`train` on `device`, the one the ceiling runs on: its own choice, `World.device`, is CUDA wherever
    torch has it. And without its progress bar: train.py passes `disable=` to tqdm, which then ignores
    TQDM_DISABLE (read, besides, when tqdm is imported)."""

    def quiet_progress(*args, **kwargs):
        return tqdm(*args, **{**kwargs, "disable": True})

    with mock.patch.object(World, "device", property(lambda world: device)), \
            mock.patch.object(train_loop, "tqdm", quiet_progress):
        yield


def trained_batch(config: TrainConfig) -> dict[str, torch.Tensor]:
    """The loader's first batch as the product reads it: masked in the workers, its held-out rows
    (--held-out-fraction) dropped; so it trains as many rows as a step of the product, about."""
    dataset = StreamingSequenceDataset(config.dataset, seed=config.seed)
    masking = MaskingConfig.from_manifest(dataset.manifest)
    loader = build_dataloader(dataset, batch_size=BATCH, strategy=config.strategy, masking=masking,
                              seed=config.seed, held_out_fraction=config.held_out_fraction)
    batch = next(batch for batch in loader if "sample_index" in batch)  # a batch wholly held out trains nothing
    batch.pop(ROWS_READ, None)
    return batch


def resident(config: TrainConfig, device: torch.device, steps: int, warmup: int) -> float:
    """samples/s of the same step on one of the loader's batches kept on the device, counting the rows it
    trains as the product counts its own."""
    batch = trained_batch(config)
    rows = len(batch["sample_index"])
    attends_all = bool(batch["attention_mask"].all())
    batch = {k: v.to(device) for k, v in batch.items()}
    objective = OBJECTIVES["mlm"](load_mlm_model(config.model)).to(device)
    optimizer = adamw(objective, config.weight_decay, config.learning_rate, fused=device.type == "cuda")
    model = torch.compile(objective) if config.compile else objective
    model.train()

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = model(batch["input_ids"], batch["attention_mask"], batch["labels"], batch[MASKED_POSITIONS],
                        attends_all)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return steps * rows / (time.perf_counter() - start)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where both sides train (default: cpu, on a GPU machine too)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: 150 on cuda, 40 on cpu)")
    parser.add_argument("--rows", type=int, default=20_480, help="rows of the dataset (default: 20,480)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4], help="loader workers (default: 2 4)")
    args = parser.parse_args(argv)
    window = cli_log_every()
    least = (SKIPPED_WINDOWS + 1) * window  # one window timed after those left out
    if args.steps is not None and args.steps < least:
        parser.error(f"--steps {args.steps}: at least {least}; the product's medians leave out its first "
                     f"{SKIPPED_WINDOWS} metrics windows of {window} steps (the CLI's --log-every) and need one more")
    return args


def cli_log_every() -> int:
    """The steps of one metrics window: `maskstream train`'s default --log-every, which the product runs with."""
    train_parser = argparse.ArgumentParser()
    add_arguments(train_parser)
    return train_parser.get_default("log_every")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    steps = args.steps if args.steps is not None else (150 if device.type == "cuda" else 40)
    transformers_logging.disable_progress_bar()  # the table, not the bars of saving a model
    # (model, --compile): the two GPU rows; a tiny model on the CPU.
    runs = [("bert-base", False), ("minilm", True)] if device.type == "cuda" else [("tiny", False)]
    card = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        dataset = write_rows(tmp_path / "dataset", args.rows)
        print(f"{card}, torch {torch.__version__}: maskstream train (CLI defaults, batch {BATCH} x 128, "
              f"{steps} steps, {args.rows:,} rows) against the same step on a resident batch")
        print(f"{'model':<10} {'compile':<8} {'workers':>7} {'train samples/s':>16} {'resident samples/s':>19} "
              f"{'ratio':>6} {'data_wait_share':>16}")
        for kind, compile_model in runs:
            model = save_model(kind, tmp_path / kind)
            ceiling = None
            for workers in args.workers:
                out = tmp_path / f"{kind}-{workers}"
                config = cli_config(dataset, out, model, steps, workers, compile_model)
                rate, wait = product(config, device)
                if ceiling is None:  # once per model: it reads no data
                    ceiling = resident(config, device, steps=steps, warmup=20)
                print(f"{kind:<10} {str(compile_model):<8} {workers:>7} {rate:>16,.0f} {ceiling:>19,.0f} "
                      f"{rate / ceiling:>6.2f} {wait:>16.3f}", flush=True)


if __name__ == "__main__":
    main()

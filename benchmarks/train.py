"""Training throughput: maskstream's loader vs Hugging Face `datasets` + its MLM collator.

A loop of its own around the data paths, for the comparison with the peer: `maskstream train`'s own
loop, at its defaults, against a resident batch is `benchmarks/train_loop.py`.

    python -m benchmarks.train [--steps 20] [--batch-size 16] [--workers 0 1]
    python -m benchmarks.train --device cuda --batch-size 256 --workers 2 4 --steps 50
    python -m benchmarks.train --device cuda --architecture bert-base --batch-size 64 --workers 2 4 --steps 50

The same training step for both sides (MiniLM with its MLM head, `maskstream.trainer.objectives.MaskedLM`,
AdamW, batch 16 of sequences of exactly 128 tokens made from real Debian descriptions, as in
`benchmarks/masking.py`), starting from the same weights; only the data path differs:

- maskstream: the sequences written as a dataset version (Parquet shards + manifest), read by
  `StreamingSequenceDataset` + `build_dataloader`, with `difference` masking, in three places
  (issue 53: where collation and masking happen):
  - *workers collate and mask*: padded, masked tensors cross from the worker processes (with 0
    workers, all in the main process), as `maskstream train` does on CPU;
  - *workers collate, mask on device*: padded tensors cross, the masks are drawn after the
    transfer (on the GPU; on CPU in the main process), as `maskstream train` does on a GPU;
  - *samples cross, collate and mask on device*: the workers hand out each batch's rows as numpy
    arrays (`collate=False`), the main process pads them and the masks are drawn after the
    transfer;
- maskstream mixture: the same version mixed 0.8/0.2 with the corpus (JSONL) itself, tokenized on
  the fly (`maskstream train --mix general.jsonl:0.2`: `build_mixture`, then `mask_by_source`, in
  the wait: difference for the domain's rows, random for the text's);
- peer: the same token ids in a Hugging Face `datasets.Dataset`, a torch DataLoader (shuffled)
  and `DataCollatorForLanguageModeling` (15%, 80/10/10, pad to a multiple of 8).

Per side and worker count: tokens/s (non-padding tokens per second of wall time over the
measured steps) and the share of step time spent waiting for the next batch (time blocked in
`next(loader)`, plus, on a GPU, the transfer and maskstream's on-device masking; the GPU is
synchronized around that span, so it holds no queued training work). Warm-up steps
are not measured. The two sides alternate in rounds and the best round of each is kept, which
evens out a shared machine's load.

`--device cuda` runs the step as `maskstream train` does on a GPU: bf16 autocast, pinned memory,
maskstream's masks drawn in the loader workers (the side "mask on device" draws them on the device
after the transfer instead; the HF collator masks on the CPU, in its workers, as a
`transformers.Trainer` would).
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.masking import real_sequences  # (sequences of exactly 128 tokens)
from maskstream.models import default_model
from testing import sequence_dataset as factory  # (the test fixture's dataset writer)

REPO = Path(__file__).resolve().parents[1]


def measure(objective, optimizer, batches, warmup: int, steps: int, device: torch.device,
            mask_on_device=None, overlap: bool = False) -> dict[str, float]:
    """Runs warmup + steps training steps; returns tokens/s, samples/s and the data-wait share of the
    measured ones. `mask_on_device(batch)` masks a batch after its transfer (maskstream on a GPU).
    Without an `objective` (--data-only) only the batches are drawn, transferred and masked. With
    `overlap`, the GPU is not synchronized around the fetch: the next batch is drawn while the GPU
    still runs the last step, as in a training loop (the wait then counts only the host's time)."""
    iterator = iter(batches)
    tokens, wait, start = 0, 0.0, 0.0
    cuda = device.type == "cuda"
    synchronized = cuda and not overlap
    for step in range(warmup + steps):
        if step == warmup:
            if cuda:
                torch.cuda.synchronize()
            tokens, wait, start = 0, 0.0, time.perf_counter()
        if synchronized:  # the GPU's queue drained, so the wait below is the data path's alone
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = {k: v.to(device, non_blocking=True) for k, v in next(iterator).items()}
        if mask_on_device is not None:
            batch = mask_on_device(batch, step)
        if synchronized:
            torch.cuda.synchronize()
        wait += time.perf_counter() - t0
        tokens += batch["attention_mask"].sum()
        if objective is None:  # --data-only: the data path alone, as fast as it goes
            continue
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            out = objective(batch["input_ids"], batch["attention_mask"], batch["labels"])
        out["loss"].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"tokens_per_second": int(tokens) / elapsed, "data_wait_share": wait / elapsed, "seconds": elapsed,
            "samples_per_second": steps * len(batch["input_ids"]) / elapsed}


def forever(loader):
    while True:
        yield from loader


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(REPO / "data" / "debian-science.jsonl"), help="JSONL corpus")
    parser.add_argument("--steps", type=int, default=20, help="measured steps per side and round (default: 20)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first (default: 3)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds, best kept (default: 2)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (default: 16)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1],
                        help="DataLoader worker counts to compare (default: 0 1)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch threads for the training step (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--architecture", choices=["minilm", "bert-base"], default="minilm",
                        help="the offline MiniLM with an MLM head, or a BERT-base-sized masked LM built from "
                             "transformers' BertConfig defaults (110 M parameters, random weights, no download; "
                             "MiniLM's vocabulary): the GPU figures of issue 53 (default: minilm)")
    parser.add_argument("--overlap", action="store_true",
                        help="on a GPU, no synchronization around the fetch: the loop as a training run has it; "
                             "compare each path with the batch resident on the device (the data path's cost is "
                             "1 - its samples/s over the resident batch's)")
    parser.add_argument("--data-only", action="store_true",
                        help="no training step: each data path's samples/s alone, what it can feed a device "
                             "whose step is faster than this machine's")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)

    import datasets
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from maskstream.trainer.collate import collate_sequences
    from maskstream.trainer.dataset import StreamingSequenceDataset
    from maskstream.trainer.loader import build_dataloader
    from maskstream.trainer.masking import MaskingConfig, apply_masking
    from maskstream.trainer.mixture import build_mixture, mask_by_source
    from maskstream.trainer.objectives import MaskedLM, load_mlm_model

    rows, _ = real_sequences(Path(args.corpus))
    tokenizer = AutoTokenizer.from_pretrained(default_model())
    if args.architecture == "bert-base":
        from transformers import BertConfig, BertForMaskedLM

        mlm_model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer)))
    else:
        mlm_model = load_mlm_model(default_model())
    objective = MaskedLM(mlm_model).to(device)
    initial = {k: v.clone() for k, v in objective.state_dict().items()}
    hf_dataset = datasets.Dataset.from_dict({"input_ids": [list(map(int, r["input_ids"])) for r in rows]})
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, pad_to_multiple_of=8)

    with tempfile.TemporaryDirectory() as tmp:
        factory.write_dataset(tmp, rows, shards=4, row_group_size=64)

        cuda = device.type == "cuda"
        masking = MaskingConfig.from_manifest(StreamingSequenceDataset(tmp, seed=0).manifest)

        pad_token_id = tokenizer.pad_token_id

        def maskstream_batches(workers: int, *, mask_in_workers: bool = True, collate: bool = True):
            dataset = StreamingSequenceDataset(tmp, seed=0)
            loader = build_dataloader(dataset, batch_size=args.batch_size, num_workers=workers,
                                      strategy="difference", masking=masking, seed=0, mask_in_workers=mask_in_workers,
                                      pin_memory=cuda and collate, collate=collate)
            for batch in forever(loader):
                if not collate:  # the main process pads the rows; pinned, as the loader would
                    batch = collate_sequences(batch, pad_token_id)
                    batch = {k: v.pin_memory() for k, v in batch.items()} if cuda else batch
                yield batch

        def mixture_batches(workers: int):
            mixture = build_mixture(StreamingSequenceDataset(tmp, seed=0), [f"{args.corpus}:0.2"], tokenizer,
                                    strategy="difference", seed=0, batch_size=args.batch_size, num_workers=workers)
            for batch in mixture:
                masked = mask_by_source(batch, mixture.strategies, masking, seed=0)
                yield {k: masked[k] for k in ("input_ids", "attention_mask", "labels")}

        def hf_batches(workers: int):
            return forever(torch.utils.data.DataLoader(hf_dataset, batch_size=args.batch_size, shuffle=True,
                                                       num_workers=workers, collate_fn=collator, pin_memory=cuda,
                                                       persistent_workers=workers > 0))

        def resident_batches(workers: int):  # no data path: one masked batch, already on the device
            batch = {k: v.to(device) for k, v in next(maskstream_batches(0)).items()}
            while True:
                yield batch

        def difference_on_device(batch, step):
            return apply_masking(batch, "difference", masking, seed=0, epoch=step)

        sides = {"workers collate and mask": (maskstream_batches, None),
                 "workers collate, mask on device": (functools.partial(maskstream_batches, mask_in_workers=False),
                                                     difference_on_device),
                 "samples cross, collate+mask on dev": (functools.partial(maskstream_batches, mask_in_workers=False,
                                                                          collate=False), difference_on_device),
                 "maskstream 0.8/0.2 text mixture": (mixture_batches, None),
                 "HF datasets + collator (random)": (hf_batches, None),
                 "one batch resident on the device": (resident_batches, None)}
        results: dict[tuple[str, int], dict[str, float]] = {}
        for _ in range(args.rounds):
            for workers in args.workers:
                for name, (make, mask_on_device) in sides.items():
                    objective.load_state_dict(initial)
                    optimizer = torch.optim.AdamW(objective.parameters(), lr=1e-4)
                    figures = measure(None if args.data_only else objective, optimizer, make(workers), args.warmup,
                                      args.steps, device, mask_on_device, overlap=args.overlap)
                    best = results.get((name, workers))
                    if best is None or figures["tokens_per_second"] > best["tokens_per_second"]:
                        results[(name, workers)] = figures

    print_table(args, device, len(rows), list(sides), results)


def print_table(args: argparse.Namespace, device: torch.device, sequences: int, sides: list[str],
                results: dict[tuple[str, int], dict[str, float]]) -> None:
    """Each data path's best round per worker count, beside HF's and the resident batch's."""
    where = torch.cuda.get_device_name(device) + ", bf16 autocast" if device.type == "cuda" else "CPU"
    print(f"\n{'BERT-base-sized' if args.architecture == 'bert-base' else 'MiniLM'} MLM training on {where}, {args.threads} torch thread(s), batch {args.batch_size} x 128 tokens "
          f"({sequences} real sequences), {args.steps} measured steps, best of {args.rounds} rounds")
    if device.type == "cuda":
        print("GPU synchronized around each fetch (data wait = the data path's share of a step)" if not args.overlap
              else "fetch overlapped with the GPU's step, as in training (data wait = host time only)")
    print(f"{'data path':<36} {'workers':>7} {'samples/s':>10} {'tokens/s':>10} {'data wait':>10} {'vs HF':>7} "
          f"{'vs resident':>12}")
    for workers in args.workers:
        peer = results[("HF datasets + collator (random)", workers)]["tokens_per_second"]
        resident = results[("one batch resident on the device", workers)]["samples_per_second"]
        for name in sides:
            r = results[(name, workers)]
            print(f"{name:<36} {workers:>7} {r['samples_per_second']:>10.0f} {r['tokens_per_second']:>10.0f} "
                  f"{r['data_wait_share']:>9.2%} "
                  f"{r['tokens_per_second'] / peer:>6.2f}x {r['samples_per_second'] / resident:>11.3f}")


if __name__ == "__main__":
    main()

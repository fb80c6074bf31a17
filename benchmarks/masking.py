"""Masking throughput vs the Hugging Face collators, and the loader end to end.

    python -m benchmarks.masking [--corpus data/debian-science.jsonl] [--batches 20]
    python -m benchmarks.masking --device cuda   # adds the on-device table

One CPU thread (`torch.set_num_threads(1)`), sequences of exactly 128 tokens made from real
Debian descriptions (consecutive descriptions joined, MiniLM tokenizer, truncated), batch 256.

1. Positions/s (batch x 128 / time) and masked tokens/s for every maskstream strategy and for
   HF `DataCollatorForLanguageModeling` (plain, and `whole_word_mask=True`: transformers 5.x has
   no `DataCollatorForWholeWordMask`; the flag needs `offset_mapping` in the features), each
   timed from per-sample features to a masked batch (padding included: both collate; HF gets
   lists of ints, as from a tokenizer, ours numpy arrays, as `StreamingSequenceDataset` yields),
   plus our masking alone on an already collated batch. Best of 5 rounds. Ratios vs the peers.
2. The loader end to end (Parquet read + shuffle + collate + `difference` masking, one
   process, checksums on) in samples/s (wall time) from local disk over two epochs, and its peak
   RSS, for a dataset and for one 10x larger, each in a fresh subprocess (the shuffle buffer, not
   the dataset, should bound memory).
3. With `--device cuda`: every strategy's masking alone on a collated batch already on the GPU
   (as `maskstream train` draws masks there), batch 256 and 4096, wall time per batch after
   `torch.cuda.synchronize()` (best of 5 rounds), beside the same masking on one CPU thread and the
   HF plain collator on one CPU thread (its place in a GPU job: it runs in the loader workers).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from maskstream.schemas.tables import SEQUENCE_SCHEMA
from maskstream.trainer.dataset import LIST_COLUMNS
from testing import sequence_dataset as factory  # (the test fixture's dataset writer)

REPO = Path(__file__).resolve().parents[1]

BATCH = 256
LENGTH = 128


def real_sequences(corpus: Path) -> tuple[list[dict], list[str]]:
    """Rows of exactly LENGTH tokens: groups of 4 consecutive descriptions, truncated."""
    texts = factory.read_texts(corpus)
    joined = [" ".join(texts[i : i + 4]) for i in range(0, len(texts) - 3, 4)]
    rows = factory.sequence_rows(joined, max_length=LENGTH)
    keep = [i for i, r in enumerate(rows) if len(r["input_ids"]) == LENGTH]
    return [rows[i] for i in keep], [joined[i] for i in keep]


def timed(fn, repeats: int, rounds: int = 5) -> float:
    """CPU seconds per call: the best of `rounds` means over `repeats` calls. Process CPU time, not
    wall time, because the machine is shared: with one thread they agree on an idle machine."""
    fn()  # warm-up
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(repeats):
            fn()
        best = min(best, (time.process_time() - start) / repeats)
    return best


def as_stored(row: dict, sample_index: int) -> dict:
    """A row as the dataset yields it: 1-D numpy arrays of the stored types, plus its index."""
    types = {field.name: field.type.value_type.to_pandas_dtype() for field in SEQUENCE_SCHEMA if field.name in LIST_COLUMNS}
    return {**{name: np.asarray(row[name], dtype=types[name]) for name in LIST_COLUMNS}, "sample_index": sample_index}


def masking_table(rows: list[dict], texts: list[str], batches: int) -> None:
    from transformers import DataCollatorForLanguageModeling

    from maskstream.trainer.collate import collate_sequences
    from maskstream.trainer.masking import MaskingConfig, apply_masking

    tok = factory.tokenizer()
    samples = [as_stored(r, i) for i, r in enumerate(rows[:BATCH])]
    assert len(samples) == BATCH, f"need {BATCH} sequences of {LENGTH} tokens, got {len(samples)}"
    encoded = tok(texts[:BATCH], truncation=True, max_length=LENGTH, return_special_tokens_mask=True,
                  return_offsets_mapping=True)
    plain_features = [{"input_ids": encoded["input_ids"][i], "special_tokens_mask": encoded["special_tokens_mask"][i]}
                      for i in range(BATCH)]
    wwm_features = [{**f, "offset_mapping": encoded["offset_mapping"][i]} for i, f in enumerate(plain_features)]
    positions = BATCH * LENGTH
    results = []  # (name, seconds per batch, masked tokens per batch)

    for name, whole_word, features in (("HF plain", False, plain_features), ("HF whole_word_mask=True", True, wwm_features)):
        collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, whole_word_mask=whole_word)
        out = collator([dict(f) for f in features])
        masked = int((out["labels"] != -100).sum())
        results.append((name, timed(lambda c=collator, f=features: c([dict(x) for x in f]), batches), masked))

    config = MaskingConfig.from_tokenizer(tok)
    batch = collate_sequences(samples, tok.pad_token_id)
    ours = [("random", "random", False), ("whole_word", "whole_word", False), ("span", "span", False),
            ("difference", "difference", False), ("difference whole-word", "difference", True), ("tmr", "tmr", False)]
    mask_only = {}
    for name, strategy, whole_word in ours:
        cfg = MaskingConfig(**{**config.__dict__, "whole_word": whole_word})
        epoch = iter(range(10**9))
        masked = int((apply_masking(batch, strategy, cfg, seed=0, epoch=0)["labels"] != -100).sum())
        seconds = timed(lambda s=strategy, c=cfg, e=epoch: apply_masking(
            collate_sequences(samples, tok.pad_token_id), s, c, seed=0, epoch=next(e)), batches)
        mask_only[name] = timed(lambda s=strategy, c=cfg, e=epoch: apply_masking(batch, s, c, seed=0, epoch=next(e)), batches)
        results.append((name, seconds, masked))

    per = {name: (sec, m) for name, sec, m in results}
    print(f"\n## Masking, batch {BATCH} x {LENGTH} tokens, 1 CPU thread, real Debian text "
          f"(collate + mask, from per-sample features)\n")
    print("| method | ms/batch | M positions/s | M masked tokens/s | masked/batch | vs HF plain | vs HF whole-word | mask only, ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, sec, masked in results:
        only = f"{mask_only[name] * 1e3:.2f}" if name in mask_only else ""
        print(f"| {name} | {sec * 1e3:.2f} | {positions / sec / 1e6:.2f} | {masked / sec / 1e6:.3f} | {masked} | "
              f"{per['HF plain'][0] / sec:.1f}x | {per['HF whole_word_mask=True'][0] / sec:.1f}x | {only} |")
    print("\nTargets:")
    print(f"- random vs HF plain: {per['HF plain'][0] / per['random'][0]:.1f}x (target >= 3x)")
    print(f"- difference whole-word vs HF whole-word: "
          f"{per['HF whole_word_mask=True'][0] / per['difference whole-word'][0]:.1f}x (target >= 10x)")
    print(f"- difference cost / random cost: {per['difference'][0] / per['random'][0]:.2f} with collation, "
          f"{mask_only['difference'] / mask_only['random']:.2f} masking alone (target <= 1.5)")
    return {"hf_plain": per["HF plain"][0], "mask_only": mask_only, "batch": batch, "config": config}


def timed_on_device(fn, repeats: int, rounds: int = 5) -> float:
    """Wall seconds per call of a GPU function: best of `rounds` means, synchronized."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def device_table(cpu: dict, batches: int, device: str) -> None:
    from maskstream.trainer.masking import MaskingConfig, apply_masking

    strategies = [("random", "random", False), ("whole_word", "whole_word", False), ("span", "span", False),
                  ("difference", "difference", False), ("difference whole-word", "difference", True),
                  ("tmr", "tmr", False)]
    print(f"\n## Masking alone on {torch.cuda.get_device_name(device)} (batch already on the device), "
          f"vs one CPU thread\n")
    print("| method | batch | GPU ms/batch | GPU M positions/s | CPU ms/batch (batch 256) | GPU vs CPU, per position "
          "| GPU vs HF plain collator (CPU), per position |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rows in (BATCH, 16 * BATCH):
        reps = rows // BATCH
        batch = {k: v.repeat(reps, *([1] * (v.dim() - 1))).to(device) for k, v in cpu["batch"].items()}
        batch["sample_index"] = torch.arange(rows, device=device)  # distinct samples, distinct masks
        for name, strategy, whole_word in strategies:
            cfg = MaskingConfig(**{**cpu["config"].__dict__, "whole_word": whole_word})
            epoch = iter(range(10**9))
            seconds = timed_on_device(lambda s=strategy, c=cfg, e=epoch, b=batch: apply_masking(
                b, s, c, seed=0, epoch=next(e)), batches)
            per_position = seconds / (rows * LENGTH)
            cpu_per_position = cpu["mask_only"][name] / (BATCH * LENGTH)
            print(f"| {name} | {rows} | {seconds * 1e3:.3f} | {rows * LENGTH / seconds / 1e6:.1f} | "
                  f"{cpu['mask_only'][name] * 1e3:.2f} | {cpu_per_position / per_position:.0f}x | "
                  f"{cpu['hf_plain'] / (BATCH * LENGTH) / per_position:.0f}x |")


def loader_child(dataset: str, shuffle_buffer: int) -> None:
    """One epoch through the loader; prints samples/s and peak RSS as JSON."""
    torch.set_num_threads(1)
    from maskstream.trainer.dataset import StreamingSequenceDataset
    from maskstream.trainer.loader import build_dataloader
    from maskstream.trainer.masking import MaskingConfig

    ds = StreamingSequenceDataset(dataset, seed=0, shuffle_buffer=shuffle_buffer)
    loader = build_dataloader(ds, batch_size=BATCH, strategy="difference",
                              masking=MaskingConfig.from_manifest(ds.manifest), num_workers=0)
    figures = {"rows": ds.total_rows}
    for epoch, name in ((0, "cold"), (1, "warm")):
        ds.set_epoch(epoch)
        start = time.perf_counter()
        figures[f"{name}_samples"] = sum(len(b["sample_index"]) for b in loader)
        figures[f"{name}_seconds"] = time.perf_counter() - start
    figures["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(figures))


def loader_table(rows: list[dict], base_rows: int, shuffle_buffer: int) -> None:
    print(f"\n## Loader end to end: Parquet read + shuffle (buffer {shuffle_buffer}) + collate + difference "
          f"masking, batch {BATCH}, one process, 1 thread, local disk, checksums on\n")
    print("| rows | shards | samples/s, epoch 0 (cold: checksums, first reads) | samples/s, epoch 1 | peak RSS MB |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (1, 10):
            n = base_rows * scale
            data = [{**rows[i % len(rows)], "sequence_id": i} for i in range(n)]
            root = f"{tmp}/x{scale}"
            factory.write_dataset(root, data, shards=4 * scale, row_group_size=1024)
            out = subprocess.run([sys.executable, __file__, "--loader-child", root, "--shuffle-buffer", str(shuffle_buffer)],
                                 check=True, capture_output=True, text=True, env={"PYTHONPATH": str(REPO)})
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            assert figures["cold_samples"] == figures["warm_samples"] == n
            print(f"| {n} | {4 * scale} | {n / figures['cold_seconds']:.0f} | {n / figures['warm_seconds']:.0f} "
                  f"| {figures['peak_rss_mb']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=factory.SAMPLE_CORPUS, help="JSONL corpus with a text field")
    parser.add_argument("--batches", type=int, default=20, help="timed batches per method (default: 20)")
    parser.add_argument("--loader-rows", type=int, default=4096, help="rows of the small loader dataset (default: 4096)")
    parser.add_argument("--shuffle-buffer", type=int, default=2048, help="loader shuffle buffer (default: 2048)")
    parser.add_argument("--loader-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda to add the on-device masking table (default: cpu)")
    args = parser.parse_args()
    if args.loader_child:
        loader_child(args.loader_child, args.shuffle_buffer)
        return
    torch.set_num_threads(1)
    import transformers

    rows, texts = real_sequences(args.corpus)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {len(rows)} real sequences of "
          f"{LENGTH} tokens from {args.corpus.name}; device: {args.device}")
    cpu = masking_table(rows, texts, args.batches)
    if args.device != "cpu":
        device_table(cpu, args.batches, args.device)
    loader_table(rows, args.loader_rows, args.shuffle_buffer)
    print(f"\nnumpy {np.__version__}")


if __name__ == "__main__":
    main()

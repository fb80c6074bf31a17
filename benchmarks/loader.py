"""The loader alone, with and without the local shard cache, from local disk and through the GCS
emulator (issue 41: the cache's cost against today's loader, in one run).

    python -m benchmarks.loader [--repeat 10] [--batch-size 64] [--shards 8] [--mosaic-python PYTHON]

Sequences: every shipped Debian description tokenized to at most 128 tokens (MiniLM), repeated
`--repeat` times, written as one version of `--shards` shards (row groups of 1,024). Each case
builds a `StreamingSequenceDataset` and runs two epochs through `build_dataloader` (collate only, no
masking, checksums on), with 0 and 2 workers, and reports samples/s per epoch (wall time) and the
ratio to the local loader without a cache. Epoch 0 of a cached case downloads into the cache; epoch 1
reads it. The bucket is the in-memory GCS emulator on this machine: its figures say what the
cache saves on a slow source only qualitatively (a real bucket is further away).

With `--mosaic-python`, the same sequences go through MosaicML's `StreamingDataset` too, from local
MDS, in that interpreter's environment (benchmarks/loader_mosaic.py), collated with the same
`collate_sequences`, right after ours. mosaicml-streaming 0.13 needs numpy < 2.2, transformers < 5
and torchvision, so it gets an environment of its own:

    python3 -m venv /tmp/mosaic && /tmp/mosaic/bin/pip install torch==2.13.0 \
        && /tmp/mosaic/bin/pip install torchvision "numpy<2.2" "transformers<5" pyarrow mosaicml-streaming==0.13.0

(torchvision moves that environment to its own torch, with CUDA libraries: a few GB, nowhere near
maskstream's environment.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import fsspec
import torch

from maskstream.schemas.manifest import load_manifest
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.loader import build_dataloader
from maskstream.trainer.shard_cache import ShardCache
from tests.fixtures import sequence_dataset as factory
from tests.fixtures.gcs_emulator import gcs_emulator


def epoch_rates(root: str, workers: int, batch_size: int, cache: ShardCache | None) -> list[float]:
    """Samples/s of epochs 0 and 1."""
    dataset = StreamingSequenceDataset(root, seed=0, shuffle_buffer=4096, cache=cache)
    loader = build_dataloader(dataset, batch_size=batch_size, num_workers=workers, strategy=None, masking=None)
    rates = []
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        start = time.perf_counter()
        samples = sum(len(batch["sample_index"]) for batch in loader)
        rates.append(samples / (time.perf_counter() - start))
        assert samples == dataset.rows_per_rank()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=10, help="copies of the shipped sequences (default: 10)")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default: 64)")
    parser.add_argument("--shards", type=int, default=8, help="shards of the version (default: 8)")
    parser.add_argument("--mosaic-python", default=None, metavar="PYTHON",
                        help="an interpreter with mosaicml-streaming: also run MosaicML's loader (default: skip)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = factory.sequence_rows(factory.read_texts(), max_length=128)
    data = [{**rows[i % len(rows)], "sequence_id": i} for i in range(len(rows) * args.repeat)]
    with tempfile.TemporaryDirectory() as tmp, gcs_emulator():
        local = f"{tmp}/dataset"
        factory.write_dataset(local, data, shards=args.shards, row_group_size=1024)
        gcs = fsspec.filesystem("gcs")
        gcs.mkdir("bench")
        gcs.put(local, "bench/dataset", recursive=True)
        remote = "gs://bench/dataset"
        size = sum(s.bytes for s in load_manifest(local)[1].shards)
        print(f"{len(data):,} sequences ({size / 1e6:.1f} MB in {args.shards} shards), batch {args.batch_size}, "
              "collate only, checksums on\n")
        print("| source | cache | workers | samples/s, epoch 0 | samples/s, epoch 1 | epoch 1 vs local, no cache |")
        print("| --- | --- | --: | --: | --: | --: |")
        ours = {}
        for workers in (0, 2):
            baseline = None
            for name, root, cached in (("local", local, False), ("local", local, True),
                                       ("GCS emulator", remote, False), ("GCS emulator", remote, True)):
                cache = ShardCache(Path(tmp) / f"cache-{name}-{workers}", limit_bytes=2 * size) if cached else None
                rates = epoch_rates(root, workers, args.batch_size, cache)
                baseline = baseline or rates[1]
                if (name, cached) == ("local", False):
                    ours[workers] = rates
                print(f"| {name} | {'yes' if cached else 'no'} | {workers} | {rates[0]:,.0f} | {rates[1]:,.0f} | "
                      f"{rates[1] / baseline:.2f} |")

        if args.mosaic_python:
            mosaic_table(args.mosaic_python, load_manifest(local)[0], tmp, args.batch_size, ours)


def mosaic_table(python: str, version: str, work: str, batch_size: int, ours: dict[int, list[float]]) -> None:
    child = Path(__file__).with_name("loader_mosaic.py")
    out = subprocess.run([python, str(child), version, f"{work}/mosaic", str(batch_size)], check=True,
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    print("\n| local, collate only | workers | samples/s, epoch 0 | samples/s, epoch 1 | maskstream / MosaicML, "
          "epoch 1 |")
    print("| --- | --: | --: | --: | --: |")
    for workers in (0, 2):
        mosaic = [theirs[f"workers{workers}_epoch{e}"] for e in (0, 1)]
        print(f"| maskstream StreamingSequenceDataset (Parquet) | {workers} | {ours[workers][0]:,.0f} | "
              f"{ours[workers][1]:,.0f} | {ours[workers][1] / mosaic[1]:.1f}x |")
        print(f"| MosaicML StreamingDataset (MDS) | {workers} | {mosaic[0]:,.0f} | {mosaic[1]:,.0f} | 1.0x |")


if __name__ == "__main__":
    main()

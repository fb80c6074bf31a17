"""The loader alone, with and without the local shard cache, from local disk and through the GCS
emulator (issue 41: the cache's cost against today's loader, in one run).

    python -m benchmarks.loader [--repeat 10] [--batch-size 64] [--shards 8] [--mosaic-python PYTHON]
                                [--before GIT_REF]

Sequences: every shipped Debian description tokenized to at most 128 tokens (MiniLM), repeated
`--repeat` times, written as one version of `--shards` shards (row groups of 1,024). Each case
builds a `StreamingSequenceDataset` and runs two epochs through `build_dataloader` (collate only, no
masking, checksums on), with 0 and 2 workers, and reports samples/s per epoch (wall time) and the
ratio to the local loader without a cache. Epoch 0 of a cached case downloads into the cache; epoch 1
reads it. The bucket is the in-memory GCS emulator on this machine: its figures say what the
cache saves on a slow source only qualitatively (a real bucket is further away).

With `--before GIT_REF`, `StreamingSequenceDataset` as trainer/dataset.py was at that commit (say,
the one before the global order and elastic resume, 00fc41d) runs beside today's on the same local
sequences, alternating, the better of two rounds each: the before/after ratio of issue 41's target
(at most 10 % slower). It also times the rest of an epoch after an elastic resume (saved with
2 workers and batch B at a third of the epoch, resumed with 0 workers and batch 1.5 B) against a
whole epoch in the resumed layout.

Always: a 0.8/0.2 mixture (`maskstream.trainer.mixture`) against the domain's loader alone, with the
second source another version or JSONL text tokenized on the fly, 0 and 2 workers, two epochs' steps
after the first batch, alternating, the better of two rounds.

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
import sys
import tempfile
import time
import types
from pathlib import Path

import fsspec
import torch

from maskstream.schemas.manifest import load_manifest
from maskstream.trainer.dataset import StreamingSequenceDataset
from maskstream.trainer.loader import build_dataloader
from maskstream.trainer.mixture import build_mixture
from maskstream.trainer.shard_cache import ShardCache
from testing import sequence_dataset as factory
from testing.gcs_emulator import gcs_emulator

REPO = Path(__file__).resolve().parents[1]


def epoch_rates(root: str, workers: int, batch_size: int, cache: ShardCache | None,
                dataset_class: type = StreamingSequenceDataset) -> list[float]:
    """Samples/s of epochs 0 and 1."""
    dataset = dataset_class(root, seed=0, shuffle_buffer=4096, cache=cache)
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
    parser.add_argument("--before", default=None, metavar="GIT_REF",
                        help="also run trainer/dataset.py as it was at GIT_REF, for a before/after ratio (default: skip)")
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

        mixture_table(local, args.batch_size)
        if args.before:
            before_after_table(local, args.before, args.batch_size)
            elastic_rest_table(local, args.batch_size)
        if args.mosaic_python:
            mosaic_table(args.mosaic_python, load_manifest(local)[0], tmp, args.batch_size, ours)


def mixture_table(local: str, batch_size: int) -> None:
    """Samples/s of a 0.8/0.2 mixture (batches drawn, not masked) against the domain's loader alone:
    the second source another maskstream version (the same sequences), or JSONL text tokenized on the
    fly (in the loader workers when there are some). Two epochs' steps each, the three alternating,
    the better of two rounds."""
    text_path = factory.SAMPLE_CORPUS  # the shipped corpus's `text` fields, as general text
    cases = (("the domain alone", None), ("0.8 domain + 0.2 maskstream version", f"{local}:0.2"),
             ("0.8 domain + 0.2 JSONL text, tokenized on the fly", f"{text_path}:0.2"))

    def rate(workers: int, mix: str | None) -> float:
        domain = StreamingSequenceDataset(local, seed=0, shuffle_buffer=4096)
        steps = 2 * domain.steps_per_epoch(batch_size)
        if mix is None:
            loader = build_dataloader(domain, batch_size=batch_size, num_workers=workers, strategy=None, masking=None)
            batches = (b for _ in range(3) for b in loader)
        else:
            batches = iter(build_mixture(domain, [mix], factory.tokenizer(), strategy="difference", seed=0,
                                         batch_size=batch_size, num_workers=workers))
        next(batches)  # the workers started and the first windows read: what one epoch's start costs
        start = time.perf_counter()
        samples = sum(len(next(batches)["sample_index"]) for _ in range(steps))
        return samples / (time.perf_counter() - start)

    print(f"\n| batch {batch_size}, local, no cache | workers | samples/s | vs the domain alone |")
    print("| --- | --: | --: | --: |")
    for workers in (0, 2):
        best = dict.fromkeys(range(len(cases)), 0.0)
        for _ in range(2):
            for index, (_, mix) in enumerate(cases):
                best[index] = max(best[index], rate(workers, mix))
        for index, (name, _) in enumerate(cases):
            print(f"| {name} | {workers} | {best[index]:,.0f} | {best[index] / best[0]:.2f} |")


def dataset_class_at(ref: str) -> type:
    """StreamingSequenceDataset as trainer/dataset.py was at git commit `ref`."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:trainer/dataset.py"], check=True,
                            capture_output=True, text=True).stdout
    name = f"dataset_at_{ref.replace('~', '_').replace('^', '_')}"
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"{ref}:trainer/dataset.py", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module.StreamingSequenceDataset


def before_after_table(local: str, ref: str, batch_size: int) -> None:
    before = dataset_class_at(ref)
    print(f"\n| local, no cache | workers | samples/s, {ref} (before) | samples/s, today | today / before |")
    print("| --- | --: | --: | --: | --: |")
    for workers in (0, 2):
        best = {"before": 0.0, "today": 0.0}
        for _ in range(2):  # alternating, the better of two epochs 1 each
            best["before"] = max(best["before"], epoch_rates(local, workers, batch_size, None, before)[1])
            best["today"] = max(best["today"], epoch_rates(local, workers, batch_size, None)[1])
        print(f"| {ref} vs today | {workers} | {best['before']:,.0f} | {best['today']:,.0f} | "
              f"{best['today'] / best['before']:.2f} |")


def elastic_rest_table(local: str, batch_size: int) -> None:
    """The rest of an epoch after an elastic resume, against a whole epoch in the same layout."""
    first = StreamingSequenceDataset(local, seed=0, shuffle_buffer=4096)
    loader = build_dataloader(first, batch_size=batch_size, num_workers=2, strategy=None, masking=None)
    stop = first.steps_per_epoch(batch_size) // 3
    for step, _ in enumerate(loader, start=1):
        if step == stop:
            break
    after = batch_size * 3 // 2
    print(f"\n| 0 workers, batch {after}, local, no cache | samples | samples/s | vs whole epoch |")
    print("| --- | --: | --: | --: |")
    whole = None
    for name, saved in (("whole epoch", None), (f"rest after an elastic resume (saved with 2 workers, batch "
                                                 f"{batch_size}, after {stop} steps)", first.state_dict())):
        dataset = StreamingSequenceDataset(local, seed=0, shuffle_buffer=4096)
        resumed = build_dataloader(dataset, batch_size=after, num_workers=0, strategy=None, masking=None)
        if saved is not None:
            dataset.load_state_dict(saved)
        start = time.perf_counter()
        samples = sum(len(batch["sample_index"]) for batch in resumed)
        rate = samples / (time.perf_counter() - start)
        whole = whole or rate
        print(f"| {name} | {samples:,} | {rate:,.0f} | {rate / whole:.2f} |")


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

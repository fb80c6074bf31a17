"""Beam's DaskRunner against the DirectRunner, on the shipped corpus and on a two-sink pipeline.

    python -m benchmarks.dask_runner          # pip install -e '.[bench]'

Starts a `dask.distributed.LocalCluster` with 2 worker processes (1 thread each) and runs, on
it (`--runner=...DaskRunner --dask_client_address=...`) and on the DirectRunner (one process):

1. the smallest pipeline with what every maskstream pipeline has, a DoFn with a tagged output
   (rejects) and two sinks: even numbers to one file, odd to another;
2. `maskstream stats` on `data/debian-science.jsonl` (its pipeline called directly: the
   command line refuses the DaskRunner, for the reasons this prints).

Prints, per runner: what each sink wrote, the stats counts and word table, and wall time.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE = REPO_ROOT / "data" / "debian-science.jsonl"
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"


def two_sinks(out: str, beam_args: list[str]) -> dict[str, list[int] | None]:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    class SplitOdd(beam.DoFn):
        def process(self, x: int):
            yield beam.pvalue.TaggedOutput("odd", x) if x % 2 else x

    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        parts = pipeline | beam.Create(range(10)) | beam.ParDo(SplitOdd()).with_outputs("odd", main="even")
        _ = parts.even | "EvenText" >> beam.Map(str) | "WriteEven" >> beam.io.WriteToText(f"{out}/even")
        _ = parts.odd | "OddText" >> beam.Map(str) | "WriteOdd" >> beam.io.WriteToText(f"{out}/odd")
    written: dict[str, list[int] | None] = {}
    for name in ("even", "odd"):
        files = glob.glob(f"{out}/{name}*")
        written[name] = sorted(int(x) for f in files for x in Path(f).read_text().split()) if files else None
    return written


def stats(out: str, beam_args: list[str]) -> dict:
    from maskstream.cli import stats as stats_command

    parser = argparse.ArgumentParser()
    stats_command.add_arguments(parser)
    args, unknown = parser.parse_known_args(["--input", str(SAMPLE), "--output", out, *beam_args])
    args.beam_args = unknown
    stats_command.run(args)
    summary = json.loads(Path(out, "summary.json").read_text())
    tables = glob.glob(f"{out}/word_stats-*.parquet")
    rows = None
    if tables:
        import pyarrow.parquet as pq

        rows = sorted(pq.read_table(tables).select(["word", "tf", "df"]).to_pylist(), key=lambda r: r["word"])
    return {"documents_read": summary.get("documents_read"), "accepted": summary.get("documents_accepted"),
            "rejected": summary.get("documents_rejected"), "word_rows": rows}


def main() -> None:
    from dask.distributed import LocalCluster

    results = {}
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                                           dashboard_address=None) as cluster:
        runners = {"DirectRunner (1 process)": ["--runner=DirectRunner"],
                   "DaskRunner (LocalCluster, 2 workers)": [f"--runner={DASK_RUNNER}",
                                                           f"--dask_client_address={cluster.scheduler_address}"]}
        for name, beam_args in runners.items():
            key = "dask" if "Dask" in name else "direct"
            start = time.perf_counter()
            sinks = two_sinks(os.path.join(tmp, key, "two"), beam_args)
            two_seconds = time.perf_counter() - start
            start = time.perf_counter()
            counts = stats(os.path.join(tmp, key, "stats"), beam_args)
            results[name] = (sinks, two_seconds, counts, time.perf_counter() - start)
    direct_rows = results["DirectRunner (1 process)"][2]["word_rows"]
    print("\n| runner | two-sink: even | two-sink: odd | s | stats: read / accepted / rejected | word rows "
          "| equal to DirectRunner | s |")
    print("| --- | --- | --- | ---: | --- | ---: | --- | ---: |")
    for name, (sinks, two_seconds, counts, stats_seconds) in results.items():
        rows = counts["word_rows"]
        print(f"| {name} | {sinks['even'] if sinks['even'] is not None else 'no file'} "
              f"| {sinks['odd'] if sinks['odd'] is not None else 'no file'} | {two_seconds:.1f} "
              f"| {counts['documents_read']} / {counts['accepted']} / {counts['rejected']} "
              f"| {len(rows) if rows is not None else 'no file'} | {rows == direct_rows} | {stats_seconds:.1f} |")


if __name__ == "__main__":
    main()

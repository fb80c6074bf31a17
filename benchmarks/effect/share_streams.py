"""How far a report's variance shares (texts / seeds / seed × text) move between random streams of the same
bootstrap, beside the Monte Carlo error the report prints from its one stream (batch means,
`statistics.share_mc_error`): the check that the printed error says what another stream would give (issue 74).

    python -m benchmarks.effect.share_streams benchmarks/effect/results/sections/confirmatory --streams 16

It recomputes the report's crossed bootstrap of `difference − random` (the same predictions, 2,000 resamples)
with bootstrap seeds 0 .. STREAMS − 1, prints each share's mean and sd over the streams beside stream 0's
share and its printed error, and writes share_streams.json into the results folder. About 80 s a stream for
issue 61's 27,513 texts on one core.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from maskstream.evaluate.design import PRIMARY_METRIC
from maskstream.evaluate.report import RESAMPLES, coded, load, with_error
from maskstream.evaluate.statistics import crossed_bootstrap

SHARES = ("texts", "seeds", "seed_x_text")


def streams(results: Path, count: int, arm: str = "difference", base: str = "random",
            resamples: int = RESAMPLES) -> dict[str, Any]:
    """The shares of `arm − base` over `count` bootstrap streams of the results' one evaluation."""
    kinds = load(results)
    if len(kinds["prepared"]) != 1:
        raise SystemExit(f"{results}: {len(kinds['prepared'])} prepared evaluations; this reads one")
    [prepared] = kinds["prepared"]
    lines = [r for r in kinds["arm"] if r["base_hash"] == prepared["base_hash"] and PRIMARY_METRIC in r]
    truth, clusters, predictions = coded(prepared, lines)
    runs = []
    for seed in range(count):
        started = time.perf_counter()
        boot = crossed_bootstrap(truth, clusters, predictions[arm], predictions[base], resamples, seed=seed)
        runs.append({"seed": seed, "share": boot["share"], "share_mc_error": boot["share_mc_error"],
                     "seconds": time.perf_counter() - started})
        print(f"stream {seed}: " + " / ".join(f"{boot['share'][k]:.4f}" for k in SHARES), flush=True)
    spread = {k: {"mean": float(np.mean([r["share"][k] for r in runs])),
                  "sd": float(np.std([r["share"][k] for r in runs], ddof=1)) if count > 1 else float("nan"),
                  "stream_0": runs[0]["share"][k], "stream_0_mc_error": runs[0]["share_mc_error"][k],
                  "mean_mc_error": float(np.mean([r["share_mc_error"][k] for r in runs]))} for k in SHARES}
    return {"comparison": f"{arm} − {base}", "resamples": resamples, "streams": count, "spread": spread,
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a results folder holding results.jsonl (one evaluation)")
    parser.add_argument("--streams", type=int, default=16, help="bootstrap seeds 0 .. N-1 (default 16)")
    args = parser.parse_args(argv)
    out = streams(args.folder / "results.jsonl", args.streams)
    print(f"\n{out['comparison']}, {out['resamples']:,} resamples, {out['streams']} streams")
    print(f"{'share':<12} {'over the streams (mean ± sd)':>30} {'stream 0 as the report prints it':>34} "
          f"{'sd / printed error':>20}")
    for k, s in out["spread"].items():
        print(f"{k:<12} {with_error(s['mean'], s['sd']):>30} {with_error(s['stream_0'], s['stream_0_mc_error']):>34} "
              f"{s['sd'] / s['mean_mc_error']:>20.2f}")
    path = args.folder / "share_streams.json"
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

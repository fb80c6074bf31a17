"""Does difference masking beat random masking on your data? A/B masking strategies, judged on every labeled text.

Takes a labeled file (the downstream task) and, optionally, unlabeled task text. For each arm (a masking
strategy) and seed, the model is pretrained further on the task's text (TAPT) and judged by a probe, a
logistic regression on its frozen mean-pooled features, by macro-F1 over every labeled text:

1. prepare: the labeled texts are clustered by near-duplication (word-trigram Jaccard >= 0.5, found by an
   exact join) and the clusters dealt into --folds folds, stratified by label; for each fold, every corpus
   an arm reads (the TAPT text, a background corpus) loses the near-duplicates of the fold's texts, and
   the arms' datasets are built (`maskstream stats`, `seeds`, `build`);
2. pilot: with several --passes, a pilot on --pilot-seeds chooses the TAPT length;
3. run: per (arm, seed) and fold, `maskstream train` from --model, then the probe's out-of-fold
   predictions on the fold's texts; an (arm, seed)'s score is the mean over folds;
4. report: OUTPUT/REPORT.md and OUTPUT/differences-CONFIG.png: each arm against random masking, paired by
   seed, with a hierarchical bootstrap over seeds and clusters, a paired t-test, TOST for equivalence
   within --margin, and the seeds and labeled texts 80 % power would need (texts and seeds counted).

Resumable: a finished (arm, seed) in OUTPUT/results.jsonl is skipped, a finished fold's readout is kept in
--work, a stopped TAPT continues from its newest checkpoint (one every tenth of its steps), and two processes
started with the same command share the work (each run is claimed with a file lock). Scratch (datasets, TAPT models,
logs) goes to --work.

Defaults: --model `english_mlm`, the general-English masked LM shipped with maskstream (4 layers x 256, its
MLM head trained; the datasets' word encoder stays the offline MiniLM), --passes 8, --learning-rate 3e-4,
seeds 0-4, arms none,random,difference. The passes and learning rate are what issue 74's pilot chose by its
pre-registered rule (benchmarks/effect/DEFAULT_PILOT.md, results/default-pilot/SUMMARY.md): on the shipped
task, one seed a setting, the control (random - none) reached its +1 point at one setting of eight, 8 passes
at 3e-4 (+1.77 [-0.34, +3.99]); at 1, 2 and 4 passes and at 8 passes with 1e-4 it was -0.68 to +0.07. Run at
these defaults (5 seeds) on the shipped 2,288 texts, the control gained but did not pass: random - none +1.61
[-0.27, +3.65], 89 % of its interval's variance from which texts were judged. On a second task, 2,439 Python
docstrings by package, pinned before its run, the control passed (+2.83 [+1.36, +4.24]). On a task this size the
report may say that it decides nothing: more labeled texts, not more seeds, narrow its intervals
(docs/evidence.md). The probe on a small model's features scores lower than on a sentence encoder's (`none` 67.47
on the shipped task, against 84.40 with the MiniLM): it compares masking strategies and is not a classifier to
keep. --model takes a model of your own; one whose MLM head was never trained (a sentence encoder such as the
MiniLM) failed the control at every setting of issue 60's pilot (docs/evidence.md).

Cost: an (arm, seed) is --folds TAPT runs of --passes over the fold's text (or of --steps steps, whatever
the text's size), then the probe. At the defaults on the shipped 2,288 texts (the default run's lines, one thread a
process, two processes on two AMD EPYC cores): about 270 TAPT steps a fold at 1.8 s a step, 13-17 s of probe
a fold, 16.5 minutes an (arm, seed); the default run recorded 10,030 s of TAPT + probe for its 10 trained
(arm, seed)s and `none`, 2.8 CPU-hours, 1.5 hours with two processes. TAPT time grows in proportion to --passes.
docs/evidence.md describes the design and our own run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from maskstream.cli.config import config_of
from maskstream.evaluate.design import ARMS, EvaluateConfig
from maskstream.evaluate.experiment import evaluate
from maskstream.evaluate.report import write_report
from maskstream.models import default_mlm


def numbers(text: str) -> tuple[int, ...]:
    """'0-4,7' -> (0, 1, 2, 3, 4, 7)."""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r}: use numbers and ranges like 0-4,7")
        out += range(int(low), int(high or low) + 1)
    return tuple(sorted(set(out)))


def names(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


def floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use numbers like 20 or 10,20,40") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--labeled", required=True, help="labeled texts: .jsonl, .jsonl.gz or .parquet")
    parser.add_argument("--text-field", default=EvaluateConfig.text_field,
                        help="text field of the labeled and domain files (default: %(default)s)")
    parser.add_argument("--label-field", default=EvaluateConfig.label_field,
                        help="label field of the labeled file (default: %(default)s)")
    parser.add_argument("--domain-corpus", nargs="+", default=None, metavar="PATTERN",
                        help="unlabeled task text for TAPT (jsonl, parquet, txt; globs) (default: the labeled texts)")
    parser.add_argument("--background-corpus", nargs="+", default=None, metavar="PATTERN",
                        help="general text for the background-contrast arms (default: none)")
    parser.add_argument("--general-corpus", nargs="+", default=None, metavar="PATTERN",
                        help="the text --model was pretrained on, if you have it: refused if it holds a labeled "
                             "text's near-duplicate (default: not checked)")
    parser.add_argument("--model", default=default_mlm(),
                        help="masked-LM name or path every arm starts from (default: the general-English masked LM "
                             "shipped with maskstream; the datasets are built with the offline MiniLM as word "
                             "encoder and --model's tokenizer)")
    parser.add_argument("--arms", type=names, default=EvaluateConfig.arms,
                        help=f"comma-separated arms of {sorted(ARMS)}; `random` is required (default: "
                             f"{','.join(EvaluateConfig.arms)})")
    parser.add_argument("--seeds", type=numbers, default=EvaluateConfig.seeds,
                        help="seeds, e.g. 0-7; the report decides nothing below 5 (default: "
                             f"{EvaluateConfig.seeds[0]}-{EvaluateConfig.seeds[-1]})")
    parser.add_argument("--passes", type=floats, default=EvaluateConfig.passes,
                        help="TAPT passes over the fold's text; several (10,20,40) run a pilot first (default: "
                             f"{','.join(f'{p:g}' for p in EvaluateConfig.passes)})")
    parser.add_argument("--steps", type=int, default=None,
                        help="TAPT optimizer steps a fold instead of --passes, so a larger corpus costs no more "
                             "TAPT (default: --passes)")
    parser.add_argument("--pilot-seeds", type=numbers, default=EvaluateConfig.pilot_seeds,
                        help=f"the pilot's seeds (default: {','.join(map(str, EvaluateConfig.pilot_seeds))})")
    parser.add_argument("--output", type=Path, required=True,
                        help="results.jsonl, REPORT.md and differences-CONFIG.png go here; rerun to continue")
    parser.add_argument("--work", type=Path, default=None, help="scratch: datasets, TAPT models, logs (default: OUTPUT/work)")
    parser.add_argument("--batch-size", type=int, default=EvaluateConfig.batch_size,
                        help="TAPT batch size (default: %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=EvaluateConfig.learning_rate,
                        help="TAPT peak learning rate (default: %(default)g)")
    parser.add_argument("--max-length", type=int, default=EvaluateConfig.max_length,
                        help="tokens per TAPT window and probe window (default: %(default)s)")
    parser.add_argument("--folds", type=int, default=EvaluateConfig.folds, help="cross-fitting folds (default: %(default)s)")
    parser.add_argument("--probe-folds", type=int, default=EvaluateConfig.probe_folds,
                        help="the probe's out-of-fold splits (default: %(default)s)")
    parser.add_argument("--margin", type=float, default=EvaluateConfig.margin,
                        help="equivalence margin in macro-F1, 0.01 = 1 point (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=EvaluateConfig.threads,
                        help="torch threads per process; run two processes on two cores (default: %(default)s)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=EvaluateConfig.device,
                        help="where TAPT and the probe run (default: %(default)s)")
    parser.add_argument("--report-only", action="store_true", help="only write REPORT.md from OUTPUT/results.jsonl")


def run(args: argparse.Namespace) -> int:
    results, report = args.output / "results.jsonl", args.output / "REPORT.md"
    if not args.report_only:
        evaluate(config_of(EvaluateConfig, args))
    if not results.exists():
        raise SystemExit(f"{results} does not exist: run without --report-only first")
    write_report(results, report, margin=args.margin, planned=len(args.seeds))
    print(f"wrote {report}")
    return 0

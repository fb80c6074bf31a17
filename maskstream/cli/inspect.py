"""Summarize and verify a dataset version written by `maskstream build`.

DATASET is a dataset root (its `latest` version is inspected) or a version folder, local or
gs://. Prints the manifest's summary, checks the sha256 of every shard against the manifest
(exit status 1 naming each shard that is missing or does not match), decodes a few sequences
with the tokens most likely to be masked marked as [[token]], and writes a PNG with the
histogram of the mask probabilities and of the expected masking rate per sequence.

Then the masking signal (pipelines/dataset/signal.py), computed again from the shards: lifts,
entropy ratio, the most and least masked words of the stored probabilities, and the same figures
for three maps recomputed from the shards' words and the word table -- the paper's similarity map,
the reference code's rank map and the sharpened map (`maskstream.pipelines.dataset.mask_probability.SHARPENED`);
plotted to a second PNG (the first one's name with `_signal`). Where they are the figures of the
manifest, which `build` printed, one line says so; otherwise (an older version, or figures that
differ) they are printed in full.

With --html PAGE, also one self-contained HTML page of all of it, with a sequence browser
(pipelines/dataset/inspect_html.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from maskstream.pipelines.dataset import inspect_html
from maskstream.pipelines.dataset.signal import signal_reports


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", metavar="DATASET", help="dataset root or version folder (local or gs://)")
    parser.add_argument("--samples", type=int, default=3, help="sequences to decode and show (default: 3)")
    parser.add_argument("--top-fraction", type=float, default=0.15,
                        help="mark this fraction of each shown sequence's tokens, most likely first (default: 0.15)")
    parser.add_argument("--plot", default=None,
                        help="PNG to write (default: mask_probabilities.png in the current folder)")
    parser.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the shards (default: check)")
    parser.add_argument("--html", default=None, metavar="PAGE",
                        help="also write one self-contained HTML page (sequence browser, seeds, signal, provenance)")
    parser.add_argument("--html-sequences", type=int, default=inspect_html.DEFAULT_SEQUENCES, metavar="N",
                        help=f"sequences the page's browser holds, spread evenly over the version; fewer if the "
                             f"page would exceed {inspect_html.MAX_PAGE_BYTES / 1e6:g} MB "
                             f"(default: {inspect_html.DEFAULT_SEQUENCES})")


def mark_tokens(tokens: list[str], probability, special, fraction: float) -> str:
    """Tokens joined by spaces, the top `fraction` of non-special tokens by probability as [[token]]."""
    import numpy as np

    probability = np.asarray(probability, np.float64)
    candidates = np.flatnonzero(np.asarray(special) == 0)
    k = max(1, round(fraction * len(candidates))) if len(candidates) else 0
    top = set(candidates[np.argsort(-probability[candidates], kind="stable")[:k]].tolist())
    return " ".join(f"[[{t}]]" if i in top else t for i, t in enumerate(tokens))


def summary_lines(version_url: str, manifest) -> list[str]:
    from maskstream.schemas.models import manifest_model_name

    docs = manifest.source_fingerprint.get("documents", {})
    config = manifest.config
    return [
        f"dataset version  {version_url}",
        f"created          {manifest.created_at} (schema {manifest.schema_version})",
        f"tokenizer        {manifest_model_name(manifest.tokenizer)} (vocab {manifest.tokenizer.get('vocab_size')}, "
        f"hash {str(manifest.tokenizer.get('vocab_hash'))[:12]})",
        f"encoder          {manifest_model_name(manifest.encoder)} ({manifest.encoder.get('pooling', '?')} pooling, "
        f"{manifest.encoder.get('dtype', 'float32')})",
        f"seeds            {', '.join(manifest.seeds)}",
        f"documents        read {docs.get('read', '?')}, accepted {docs.get('accepted', '?')}, "
        f"rejected {docs.get('rejected', '?')}",
        f"sequences        {manifest.total_rows} in {len(manifest.shards)} shards, {manifest.total_tokens} tokens, "
        f"{manifest.total_bytes} bytes",
        f"masking          {config.get('weighting')} weights, sharpness {config.get('sharpness', 1.0)}, "
        f"floor {config.get('floor', 0.0)}, alpha {config.get('alpha')}, budget {config.get('budget')}, "
        f"reduce {config.get('reduce')}, max length {config.get('max_length')}, packing {config.get('packing')}",
        f"formulas         {', '.join(f'{k}={v}' for k, v in sorted(manifest.formulas.items()))}",
    ]


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from maskstream.pipelines.dataset.dataset_writer import join, verify_shard
    from maskstream.pipelines.dataset.signal import inspect_lines, map_tallies, plot_histograms, plot_report
    from maskstream.schemas.manifest import ManifestError, load_manifest, read_word_table
    from maskstream.schemas.tables import SEQUENCE_SCHEMA, SchemaMismatch, check_schema

    try:
        version_url, manifest = load_manifest(args.dataset)
    except (ManifestError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for line in summary_lines(version_url, manifest):
        print(line)

    failures = [] if args.no_verify else [r for s in manifest.shards if (r := verify_shard(version_url, s))]
    if failures:
        for failure in failures:
            print(f"CHECKSUM FAILURE {failure}", file=sys.stderr)
        return 1
    if not args.no_verify:
        print(f"checksums        all {len(manifest.shards)} shards match the manifest")

    import fsspec

    probabilities: list[Any] = []
    rates: list[float] = []
    shown: list[dict[str, Any]] = []
    columns = ["sequence_id", "input_ids", "word_ids", "word_index", "special_tokens_mask", "mask_probability"]
    word_table = read_word_table(version_url, manifest.word_table)
    similarity = np.zeros(word_table.num_rows, np.float32)
    similarity[word_table.column("word_index").to_numpy()] = word_table.column("similarity").to_numpy()
    tallies = []  # one per shard: the whole dataset is never in memory at once
    for shard in manifest.shards:
        with fsspec.open(join(version_url, shard.path), "rb") as f:
            parquet = pq.ParquetFile(f)
            try:
                check_schema(parquet.schema_arrow, SEQUENCE_SCHEMA, shard.path)
            except SchemaMismatch as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            if len(shown) < args.samples:
                shown.extend(parquet.read_row_group(0).slice(0, args.samples - len(shown)).to_pylist())
            table = parquet.read(columns=columns)
        tallies.append(map_tallies(table, similarity, manifest.config, manifest.total_rows))
        special = np.asarray(table.column("special_tokens_mask").combine_chunks().flatten(), np.int8)
        probability = np.asarray(table.column("mask_probability").combine_chunks().flatten(), np.float32)
        probabilities.append(probability[special == 0])
        lengths = table.column("input_ids").combine_chunks().value_lengths().to_numpy()
        row = np.repeat(np.arange(len(lengths)), lengths)
        expected = np.bincount(row, weights=probability, minlength=len(lengths))
        count = np.bincount(row, weights=(special == 0), minlength=len(lengths))
        rates.extend((expected / np.maximum(count, 1)).tolist())

    tokenizer = AutoTokenizer.from_pretrained(manifest.tokenizer["name"])
    for row in shown:
        tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
        print(f"\nsequence {row['sequence_id']} ({row['document_id']}, {len(tokens)} tokens, "
              f"expected masked {sum(row['mask_probability']):.2f}):")
        print(mark_tokens(tokens, row["mask_probability"], row["special_tokens_mask"], args.top_fraction))

    all_probabilities = np.concatenate(probabilities) if probabilities else np.zeros(0)
    plot = args.plot or "mask_probabilities.png"
    plot_histograms(all_probabilities, rates, plot, f"{manifest.version}: {manifest.total_rows} sequences")
    print(f"\nmask probability  mean {all_probabilities.mean():.4f}, max {all_probabilities.max():.4f}; "
          f"expected masked fraction per sequence mean {np.mean(rates):.4f}")
    print(f"plot             {plot}")

    reports = signal_reports(tallies, word_table, manifest.seeds)
    built_name, built = next(iter(reports.items()))
    print()
    print("\n".join(inspect_lines(reports, manifest)))
    signal_plot = plot.removesuffix(".png") + "_signal.png"
    plot_report(built, signal_plot, f"{manifest.version}: {built_name}")
    print(f"signal plot      {signal_plot}")
    if args.html:
        page = inspect_html.write_page(args.html, version_url, manifest, tokenizer=tokenizer, word_table=word_table,
                                       reports=reports, probabilities=all_probabilities, rates=rates,
                                       verified=not args.no_verify, sequences=args.html_sequences)
        print(f"html page        {args.html} ({page['bytes']:,} bytes, {page['sequences']} sequences); "
              "open it in a browser")
    return 0

"""Summarize and verify a dataset version written by `maskstream build`.

DATASET is a dataset root (its `latest` version is inspected) or a version folder, local or
gs://. Prints the manifest's summary, checks the sha256 of every shard against the manifest
(exit status 1 naming each shard that is missing or does not match), decodes a few sequences
with the tokens most likely to be masked marked as [[token]], and writes a PNG with the
histogram of the mask probabilities and of the expected masking rate per sequence.

Then the masking signal (pipelines/dataset/core/signal_tallies.py), computed again from the shards: lifts,
entropy ratio, the most and least masked words of the stored probabilities, and the same figures
for three maps recomputed from the shards' words and the word table -- the paper's similarity map,
the reference code's rank map and the sharpened map (`maskstream.mask_signal.probability.SHARPENED`);
plotted to a second PNG (the first one's name with `_signal`). Where they are the figures of the
manifest, which `build` printed, one line says so; otherwise (an older version, or figures that
differ) they are printed in full.

A version built with --peer-signals also gets its top collocations, the ones its sequences hold and
the share of words inside one, and its most and least informative words.

With --html PAGE, also one self-contained HTML page of all of it, with a sequence browser
(pipelines/dataset/inspect/inspect_html.py).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from maskstream.models import manifest_model_name
from maskstream.pipelines.dataset.inspect import inspect_html
from maskstream.pipelines.dataset.inspect.peer_summary import peer_signal_lines, peer_signal_rows, summarize
from maskstream.pipelines.dataset.inspect.signal import (
    inspect_lines,
    plot_histograms,
    plot_report,
    signal_reports,
)
from maskstream.pipelines.dataset.inspect.version_contents import mark_tokens, read_version_contents
from maskstream.pipelines.dataset.storage.dataset_writer import verify_shard
from maskstream.schemas.manifest import Manifest, ManifestError, load_manifest
from maskstream.schemas.tables import SchemaMismatch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", metavar="DATASET", help="dataset root or version folder (local or gs://)")
    parser.add_argument("--samples", type=int, default=3, help="sequences to decode and show (default: 3)")
    parser.add_argument("--top-fraction", type=float, default=0.15,
                        help="mark this fraction of each shown sequence's tokens, most likely first (default: 0.15)")
    parser.add_argument("--plot", default=None, metavar="PNG",
                        help="also write the histograms to PNG and the signal plot to PNG's name + _signal.png "
                             "(default: no file written)")
    parser.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the shards (default: check)")
    parser.add_argument("--html", default=None, metavar="PAGE",
                        help="also write one self-contained HTML page (sequence browser, seeds, signal, provenance)")
    parser.add_argument("--html-sequences", type=int, default=inspect_html.DEFAULT_SEQUENCES, metavar="N",
                        help=f"sequences the page's browser holds, spread evenly over the version; fewer if the "
                             f"page would exceed {inspect_html.MAX_PAGE_BYTES / 1e6:g} MB "
                             f"(default: {inspect_html.DEFAULT_SEQUENCES})")


def summary_lines(version_url: str, manifest: Manifest) -> list[str]:
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
    try:
        version_url, manifest = load_manifest(args.dataset)
    except (ManifestError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for line in summary_lines(version_url, manifest):
        print(line)
    failures = [] if args.no_verify else [r for s in manifest.shards if (r := verify_shard(version_url, s))]
    for failure in failures:
        print(f"CHECKSUM FAILURE {failure}", file=sys.stderr)
    if failures:
        return 1
    if not args.no_verify:
        print(f"checksums        all {len(manifest.shards)} shards match the manifest")
    try:
        contents = read_version_contents(version_url, manifest, args.samples)
    except SchemaMismatch as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    # Heavy (transformers): only once the manifest and the shards have been checked.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(manifest.tokenizer["name"])
    for row in contents.samples:
        tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
        print(f"\nsequence {row['sequence_id']} ({row['document_id']}, {len(tokens)} tokens, "
              f"expected masked {sum(row['mask_probability']):.2f}):")
        print(mark_tokens(tokens, row["mask_probability"], row["special_tokens_mask"], args.top_fraction))

    probabilities, rates = contents.probabilities, contents.rates
    print(f"\nmask probability  mean {probabilities.mean():.4f}, max {probabilities.max():.4f}; "
          f"expected masked fraction per sequence mean {np.mean(rates):.4f}")
    if args.plot:
        plot_histograms(probabilities, rates, args.plot, f"{manifest.version}: {manifest.total_rows} sequences")
        print(f"plot             {args.plot}")

    reports = signal_reports(contents.tallies, contents.word_table, manifest.seeds)
    built_name, built = next(iter(reports.items()))
    print()
    print("\n".join(inspect_lines(reports, manifest)))
    if args.plot:
        signal_plot = args.plot.removesuffix(".png") + "_signal.png"
        plot_report(built, signal_plot, f"{manifest.version}: {built_name}")
        print(f"signal plot      {signal_plot}")
    peers = summarize(version_url, manifest, contents.word_table)
    print()
    print("\n".join(peer_signal_lines(peers, manifest)))
    if args.html:
        page = inspect_html.write_page(args.html, version_url, manifest, tokenizer=tokenizer,
                                       word_table=contents.word_table, reports=reports, probabilities=probabilities,
                                       rates=rates, verified=not args.no_verify, sequences=args.html_sequences,
                                       peer_rows=peer_signal_rows(peers) if peers else None)
        print(f"html page        {args.html} ({page['bytes']:,} bytes, {page['sequences']} sequences); "
              "open it in a browser")
    return 0

"""Word statistics of a domain corpus (an Apache Beam pipeline).

Reads the corpus (.txt, .jsonl, .parquet; local paths or gs:// globs), counts every word
(schemas/words.py) -- tf (occurrences), df (documents) and the number of documents N -- looks
up each word's frequency in general text (the offline wordfreq tables, or a second corpus
given with --general-input), and scores it by TF-ICF (see pipelines/statistics/tf_icf.py). With
--background-input, a background corpus (the broader text the domain is part of) is counted the
same way and each word also gets its background frequency and its background contrast. Writes

  OUTPUT/word_stats-*.parquet   one row per word (maskstream.schemas.tables.WORD_STATS_SCHEMA)
  OUTPUT/summary.json           documents read/accepted/rejected, distinct and total words, N,
                                the corpus fingerprint, the configuration and formula versions
  OUTPUT/rejects-*.jsonl        one {"source", "location", "reason"} per rejected record

Results are written to a temporary folder beside OUTPUT and moved into place only when the
pipeline succeeded with at least one accepted document; a missing input or zero accepted
documents is an error (exit status 2) and leaves OUTPUT untouched.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from typing import Any

from maskstream.schemas.formulas import TF_ICF_UNSEEN_COUNT as DEFAULT_UNSEEN_COUNT

LOGGER = logging.getLogger(__name__)
SUMMARY_NAME = "summary.json"
COUNTS_NAME = "counts.json"
WORD_STATS_PREFIX = "word_stats"
REJECTS_PREFIX = "rejects"
GENERAL_REJECTS_PREFIX = "general_rejects"
BACKGROUND_REJECTS_PREFIX = "background_rejects"
EXIT_INPUT_ERROR = 2


class StatsError(Exception):
    """Input that cannot give statistics (nothing found, nothing accepted)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", nargs="+", required=True, metavar="PATTERN",
                        help="domain corpus files or globs (.txt, .jsonl, .parquet; local or gs://)")
    parser.add_argument("--output", required=True, metavar="STATS_DIR",
                        help="folder for word_stats-*.parquet, summary.json and rejects-*.jsonl (local or gs://)")
    parser.add_argument("--text-field", default="text",
                        help="JSONL field / Parquet column holding the text (default: text)")
    parser.add_argument("--txt-mode", choices=("line", "file"), default="line",
                        help=".txt files: a document per line or per file (default: line)")
    parser.add_argument("--general-input", nargs="+", default=None, metavar="PATTERN",
                        help="a general-text corpus to take general frequencies from, read like --input "
                             "(default: none, use the offline wordfreq tables)")
    parser.add_argument("--background-input", nargs="+", default=None, metavar="PATTERN",
                        help="a background corpus the domain is contrasted with, read like --input (e.g. all "
                             "package descriptions for the science ones); adds background_frequency and contrast "
                             "columns, which `maskstream seeds` then ranks by (default: none; docs/signal.md)")
    parser.add_argument("--general-language", default="en",
                        help="wordfreq language of the general frequencies (default: en)")
    parser.add_argument("--unseen-count", type=float, default=DEFAULT_UNSEEN_COUNT,
                        help="occurrences assumed for words general text lacks, at the general source's "
                             f"resolution (default: {DEFAULT_UNSEEN_COUNT}; see docs/statistics-and-seeds.md, 'TF-ICF')")


def count_corpus(patterns: list[str], text_field: str, txt_mode: str, rejects_prefix: str) -> Any:
    """A composite transform, PBegin -> {"counts", "documents", "words" (CountWords), "rejected":
    the number of rejects, "files": the paths read}: reads one corpus, counts its words, and writes its rejects to
    REJECTS_PREFIX-*.jsonl. The domain, general and background corpora go through the same steps."""
    import apache_beam as beam

    from maskstream.pipelines.read_corpus import ReadCorpus
    from maskstream.pipelines.statistics.stats_transforms import CountWords

    @beam.ptransform_fn
    def CountCorpus(pbegin):  # noqa: N802 (a transform's name)
        corpus = pbegin | "ReadCorpus" >> ReadCorpus(patterns, text_field, txt_mode)
        counted = corpus["documents"] | "CountWords" >> CountWords()
        _ = (
            corpus["rejects"]
            | "RejectsToJson" >> beam.Map(json.dumps, ensure_ascii=False)
            | "WriteRejects" >> beam.io.WriteToText(rejects_prefix, file_name_suffix=".jsonl")
        )
        return {**counted, "rejected": corpus["rejects"] | "CountRejects" >> beam.combiners.Count.Globally(),
                "files": corpus["files"]}

    return CountCorpus()


def build_pipeline(pipeline: Any, args: argparse.Namespace, out_dir: str) -> None:
    """Adds the stats pipeline to `pipeline`, writing into `out_dir`."""
    import apache_beam as beam
    from apache_beam.pvalue import AsSingleton

    from maskstream.pipelines.read_corpus import FingerprintFiles
    from maskstream.pipelines.statistics.stats_transforms import BackgroundContrast, TfIcf
    from maskstream.schemas.tables import WORD_STATS_BACKGROUND_SCHEMA, WORD_STATS_SCHEMA

    def counted(label: str, patterns: list[str] | None, rejects_prefix: str) -> dict | None:
        if not patterns:
            return None
        return pipeline | label >> count_corpus(patterns, args.text_field, args.txt_mode, f"{out_dir}/{rejects_prefix}")

    domain = counted("Domain", args.input, REJECTS_PREFIX)
    general = counted("General", args.general_input, GENERAL_REJECTS_PREFIX)
    background = counted("Background", args.background_input, BACKGROUND_REJECTS_PREFIX)
    rows = domain | "TfIcf" >> TfIcf(general, args.general_language, args.unseen_count)
    if background is not None:
        rows = rows | "BackgroundContrast" >> BackgroundContrast(background, domain["words"], args.unseen_count)
    _ = rows | "WriteWordStats" >> beam.io.WriteToParquet(
        f"{out_dir}/{WORD_STATS_PREFIX}", schema=WORD_STATS_SCHEMA if background is None else WORD_STATS_BACKGROUND_SCHEMA,
        file_name_suffix=".parquet",
    )

    counts = {
        "distinct_words": domain["counts"] | "CountDistinctWords" >> beam.combiners.Count.Globally(),
        # Hashed on the workers: the launching process reads no corpus bytes.
        "source_fingerprint": domain["files"] | "FingerprintCorpus" >> FingerprintFiles(),
    }
    for prefix, corpus in (("", domain), ("general_", general), ("background_", background)):
        if corpus is not None:
            counts.update({f"{prefix}documents_accepted": corpus["documents"],
                           f"{prefix}documents_rejected": corpus["rejected"], f"{prefix}total_words": corpus["words"]})
    side_inputs = {name: AsSingleton(pcoll) for name, pcoll in counts.items()}
    _ = (
        pipeline
        | "OneSummary" >> beam.Create([None])
        | "GatherCounts" >> beam.Map(lambda _, **values: json.dumps(values, sort_keys=True), **side_inputs)
        | "WriteCounts" >> beam.io.WriteToText(f"{out_dir}/{COUNTS_NAME}", num_shards=1, shard_name_template="")
    )


def _read_text(path: str) -> str:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as f:
        return f.read().decode("utf-8")


def _write_text(path: str, text: str) -> None:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(path) as f:
        f.write(text.encode("utf-8"))


def _matching(patterns: list[str]) -> list[str]:
    from apache_beam.io.filesystems import FileSystems

    return sorted(m.path for result in FileSystems.match(patterns) for m in result.metadata_list)


def _remove_tree(path: str) -> None:
    from apache_beam.io.filesystems import FileSystems

    if FileSystems.get_scheme(path) in (None, "file"):
        if FileSystems.exists(path):
            FileSystems.delete([path])
    else:
        files = _matching([f"{path}/**"])
        if files:
            FileSystems.delete(files)


def publish(staging: str, output: str) -> None:
    """Replaces the stats files in `output` by those in `staging`."""
    from apache_beam.io.filesystems import FileSystems

    names = [f"{WORD_STATS_PREFIX}-*", f"{REJECTS_PREFIX}-*", f"{GENERAL_REJECTS_PREFIX}-*",
             f"{BACKGROUND_REJECTS_PREFIX}-*", SUMMARY_NAME]
    new = _matching([f"{staging}/{name}" for name in names])
    if FileSystems.get_scheme(output) in (None, "file") and not FileSystems.exists(output):
        FileSystems.mkdirs(output)
    old = _matching([f"{output}/{name}" for name in names])
    if old:
        FileSystems.delete(old)
    FileSystems.rename(new, [f"{output}/{path.rsplit('/', 1)[1]}" for path in new])


def _summarize(args: argparse.Namespace, staging: str) -> dict[str, Any]:
    from maskstream.schemas.formulas import FORMULA_VERSIONS

    counts = json.loads(_read_text(f"{staging}/{COUNTS_NAME}"))
    accepted, rejected = counts["documents_accepted"], counts["documents_rejected"]
    if accepted == 0:
        rejects = _matching([f"{staging}/{REJECTS_PREFIX}-*"])
        examples = "".join(_read_text(path) for path in rejects).splitlines()[:5]
        raise StatsError(
            f"no document accepted from {' '.join(args.input)} ({rejected} rejected); first rejects:\n  "
            + "\n  ".join(examples)
        )
    if args.general_input and counts["general_total_words"] == 0:
        raise StatsError(f"the general corpus {' '.join(args.general_input)} has no words")
    if args.background_input and counts["background_total_words"] == 0:
        raise StatsError(f"the background corpus {' '.join(args.background_input)} has no words")
    summary: dict[str, Any] = {
        "documents_read": accepted + rejected,
        "documents_accepted": accepted,
        "documents_rejected": rejected,
        "N": accepted,
        "distinct_words": counts["distinct_words"],
        "total_words": counts["total_words"],
        "general_source": "corpus" if args.general_input else f"wordfreq:{args.general_language}",
        "config": {
            "input": list(args.input),
            "text_field": args.text_field,
            "txt_mode": args.txt_mode,
            "general_input": list(args.general_input or []),
            "general_language": args.general_language,
            "background_input": list(args.background_input or []),
            "unseen_count": args.unseen_count,
        },
        "formulas": dict(FORMULA_VERSIONS),
        "source_fingerprint": counts["source_fingerprint"],
    }
    for corpus, given in (("general", args.general_input), ("background", args.background_input)):
        if given:
            accepted, rejected = counts[f"{corpus}_documents_accepted"], counts[f"{corpus}_documents_rejected"]
            summary[corpus] = {"documents_read": accepted + rejected, "documents_accepted": accepted,
                               "documents_rejected": rejected, "total_words": counts[f"{corpus}_total_words"]}
    return summary


def run(args: argparse.Namespace) -> int:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from maskstream.pipelines.corpus import expand_inputs
    from maskstream.pipelines.dataflow_job import is_dry_run, job_size

    # Beam logs every string annotation (`from __future__ import annotations`) at INFO.
    logging.getLogger("apache_beam.typehints.native_type_compatibility").setLevel(logging.WARNING)
    try:
        files = expand_inputs(args.input)
        if args.general_input:
            expand_inputs(args.general_input)
        if args.background_input:
            expand_inputs(args.background_input)
    except FileNotFoundError as e:
        print(f"maskstream stats: error: {e}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    output = args.output.rstrip("/")
    staging = f"{output}.tmp-{uuid.uuid4().hex[:12]}"
    LOGGER.info("reading %d file(s); staging results in %s", len(files), staging)
    if is_dry_run(args.beam_args):  # the job is built, not run: nothing to summarize or publish
        pipeline = beam.Pipeline(options=PipelineOptions(args.beam_args))
        build_pipeline(pipeline, args, staging)
        print(job_size(pipeline.run()).line("stats"))
        return 0
    try:
        with beam.Pipeline(options=PipelineOptions(args.beam_args)) as pipeline:
            build_pipeline(pipeline, args, staging)
        summary = _summarize(args, staging)
        _write_text(f"{staging}/{SUMMARY_NAME}", json.dumps(summary, indent=2, sort_keys=True) + "\n")
        publish(staging, output)
    except StatsError as e:
        print(f"maskstream stats: error: {e}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    finally:
        _remove_tree(staging)
    print(f"wrote {output}/{WORD_STATS_PREFIX}-*.parquet, {output}/{SUMMARY_NAME}, {output}/{REJECTS_PREFIX}-*.jsonl")
    print(f"documents read: {summary['documents_read']}, accepted: {summary['documents_accepted']}, "
          f"rejected: {summary['documents_rejected']}")
    print(f"distinct words: {summary['distinct_words']}, total words: {summary['total_words']}")
    return 0

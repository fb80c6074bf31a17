"""Word statistics of a domain corpus, an Apache Beam pipeline: `compute_stats(StatsConfig)` counts
every word (tf, df, N), looks up its general frequency, scores it by TF-ICF (tf_icf.py), and with a
background corpus adds its contrast; it writes word_stats-*.parquet, summary.json and rejects-*.jsonl
into a staging folder beside the output and moves them into place only when the pipeline succeeded
with at least one accepted document (the outputs: `maskstream stats --help`, maskstream/cli/stats.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from typing import Any

from maskstream.pipelines.corpus import expand_inputs
from maskstream.pipelines.dataflow_job import is_dry_run, job_size
from maskstream.schemas.formulas import FORMULA_VERSIONS
from maskstream.schemas.formulas import TF_ICF_UNSEEN_COUNT as DEFAULT_UNSEEN_COUNT
from maskstream.schemas.tables import WORD_STATS_BACKGROUND_SCHEMA, WORD_STATS_SCHEMA
from maskstream.storage.publish import move_into_place

LOGGER = logging.getLogger(__name__)
SUMMARY_NAME = "summary.json"
COUNTS_NAME = "counts.json"
WORD_STATS_PREFIX = "word_stats"
REJECTS_PREFIX = "rejects"
GENERAL_REJECTS_PREFIX = "general_rejects"
BACKGROUND_REJECTS_PREFIX = "background_rejects"


class StatsError(Exception):
    """Input that cannot give statistics (nothing found, nothing accepted)."""


@dataclasses.dataclass(frozen=True)
class StatsConfig:
    """What `compute_stats` counts and how (the flags of `maskstream stats`); checked on construction."""

    input: list[str]
    output: str
    text_field: str = "text"
    txt_mode: str = "line"
    general_input: list[str] | None = None
    background_input: list[str] | None = None
    general_language: str = "en"
    unseen_count: float = DEFAULT_UNSEEN_COUNT

    def __post_init__(self) -> None:
        if not self.input:
            raise ValueError("--input names no file")
        if self.txt_mode not in ("line", "file"):
            raise ValueError(f"--txt-mode must be line or file, got {self.txt_mode!r}")
        if not self.unseen_count > 0:
            raise ValueError(f"--unseen-count must be > 0, got {self.unseen_count}")


def count_corpus(patterns: list[str], text_field: str, txt_mode: str, rejects_prefix: str) -> Any:
    """A composite transform, PBegin -> {"counts", "documents", "words" (CountWords), "rejected":
    the number of rejects, "files": the paths read}: reads one corpus, counts its words, and writes its rejects to
    REJECTS_PREFIX-*.jsonl. The domain, general and background corpora go through the same steps."""
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    import apache_beam as beam

    # heavy: imports apache_beam; only here, where it is needed
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


def build_pipeline(pipeline: Any, args: StatsConfig, out_dir: str) -> None:
    """Adds the stats pipeline to `pipeline`, writing into `out_dir`."""
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    import apache_beam as beam
    from apache_beam.pvalue import AsSingleton

    # heavy: imports apache_beam; only here, where it is needed
    from maskstream.pipelines.read_corpus import FingerprintFiles
    from maskstream.pipelines.statistics.stats_transforms import BackgroundContrast, TfIcf

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
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as f:
        return f.read().decode("utf-8")


def _write_text(path: str, text: str) -> None:
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(path) as f:
        f.write(text.encode("utf-8"))


def _matching(patterns: list[str]) -> list[str]:
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    from apache_beam.io.filesystems import FileSystems

    return sorted(m.path for result in FileSystems.match(patterns) for m in result.metadata_list)


def _remove_tree(path: str) -> None:
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
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
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    from apache_beam.io.filesystems import FileSystems

    names = [f"{WORD_STATS_PREFIX}-*", f"{REJECTS_PREFIX}-*", f"{GENERAL_REJECTS_PREFIX}-*",
             f"{BACKGROUND_REJECTS_PREFIX}-*", SUMMARY_NAME]
    new = _matching([f"{staging}/{name}" for name in names])
    if FileSystems.get_scheme(output) in (None, "file") and not FileSystems.exists(output):
        FileSystems.mkdirs(output)
    old = _matching([f"{output}/{name}" for name in names])
    if old:
        FileSystems.delete(old)
    for path in new:
        move_into_place(path, f"{output}/{path.rsplit('/', 1)[1]}")


def _summarize(args: StatsConfig, staging: str) -> dict[str, Any]:
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


def compute_stats(config: StatsConfig, beam_args: list[str]) -> dict[str, Any]:
    """Runs the pipeline with Beam's `beam_args` and publishes its outputs into `config.output`; returns
    the summary (summary.json), or {"dry_run": the job's size line} when Beam is asked only to build the
    job. Raises FileNotFoundError (an input matches no file) or StatsError; the output is then untouched."""
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    # Beam logs every string annotation (`from __future__ import annotations`) at INFO.
    logging.getLogger("apache_beam.typehints.native_type_compatibility").setLevel(logging.WARNING)
    files = expand_inputs(config.input)
    for extra in (config.general_input, config.background_input):
        if extra:
            expand_inputs(extra)
    output = config.output.rstrip("/")
    staging = f"{output}.tmp-{uuid.uuid4().hex[:12]}"
    LOGGER.info("reading %d file(s); staging results in %s", len(files), staging)
    if is_dry_run(beam_args):  # the job is built, not run: nothing to summarize or publish
        pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
        build_pipeline(pipeline, config, staging)
        return {"dry_run": job_size(pipeline.run()).line("stats")}
    try:
        with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
            build_pipeline(pipeline, config, staging)
        summary = _summarize(config, staging)
        _write_text(f"{staging}/{SUMMARY_NAME}", json.dumps(summary, indent=2, sort_keys=True) + "\n")
        publish(staging, output)
    finally:
        _remove_tree(staging)
    return summary

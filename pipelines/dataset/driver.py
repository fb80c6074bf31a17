"""Building a dataset version with Beam: `build_version` reads the corpus, the word statistics and the
seeds, runs the build pipeline (dataset_pipeline.BuildDataset) and returns its report; the checks of
its inputs beside it (the command: `maskstream build --help`, maskstream/cli/build.py)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import fsspec

from maskstream.mask_signal.words import words
from maskstream.pipelines.dataflow_job import is_dry_run, job_size
from maskstream.pipelines.dataset.steps import BuildConfig, manifest_fields, pipeline_counters
from maskstream.pipelines.dataset.storage.dataset_writer import (
    join,
    new_version_name,
    prepare_version,
)
from maskstream.pipelines.statistics.peer_formulas import PeerSignalSettings
from maskstream.schemas.formulas import WORD_NORMALIZATION
from maskstream.schemas.manifest import MANIFEST_NAME, SEEDS_NAME, load_manifest
from maskstream.storage.publish import write_atomically

LOG = logging.getLogger("maskstream.build")


def check_word_stats(stats_dir: str) -> None:
    """Refuses a stats folder without word statistics (a listing: no word is read here)."""
    fs, path = fsspec.core.url_to_fs(stats_dir)
    if not fs.glob(f"{path.rstrip('/')}/word_stats-*.parquet"):
        raise FileNotFoundError(f"{stats_dir} holds no word_stats-*.parquet; run `maskstream stats` first")


def warn_if_seeds_from_another_corpus(version_url: str, seeds_content: dict[str, Any]) -> None:
    seeds_fingerprint = seeds_content.get("source_fingerprint", {}).get("sha256")
    corpus_fingerprint = load_manifest(version_url)[1].source_fingerprint.get("sha256")
    if seeds_fingerprint and seeds_fingerprint != corpus_fingerprint:
        LOG.warning("the seeds were computed from a different corpus (fingerprint %s, input %s)",
                    seeds_fingerprint, corpus_fingerprint)


def read_seeds(seeds_json: str) -> tuple[list[str], bytes, dict[str, Any]]:
    """(seed words best first, the file's bytes, its parsed content)."""
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
    """Refuses seeds that are not words of this build's normalization (mask_signal/words.py): a seeds
    file made with another word normalization, or listing another tokenizer's subword tokens
    (`##ing`, `Ġprotein`, `▁protein`), would match no word of the corpus."""

    theirs = formulas.get("word_normalization", WORD_NORMALIZATION)
    if theirs != WORD_NORMALIZATION:
        raise ValueError(f"{seeds_json} was made with word normalization {theirs!r}; this build uses "
                         f"{WORD_NORMALIZATION!r}: recompute the seeds with `maskstream stats` and `maskstream seeds`")
    foreign = [seed for seed in seeds if words(seed) != [seed]]
    if foreign:
        raise ValueError(f"{seeds_json}: {len(foreign)} seed(s) are not words under {WORD_NORMALIZATION} "
                         f"(subword tokens of another tokenizer?): {', '.join(map(repr, foreign[:5]))}")


def build_version(config: BuildConfig, inputs: list[str], text_field: str, txt_mode: str, stats: str,
                  seeds_json: str, root: str, version: str | None, beam_args: list[str],
                  peer_signals: PeerSignalSettings | None = None) -> dict[str, Any]:
    """Builds ROOT/VERSION/ of the corpus `inputs` with Beam's `beam_args` and points ROOT/latest at it;
    returns the pipeline's report with "version_url" ({"dry_run": the job's size line} when Beam is asked
    only to build the job). Raises ValueError, FileNotFoundError or FileExistsError on bad input, before
    a version is written, and ValueError when no document gave a sequence. `peer_signals`: also
    compute the peers' signals (pipelines/dataset/beam/peer_transforms.py) with these settings."""
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    # heavy: imports apache_beam; only here, where it is needed
    from maskstream.pipelines.dataset.beam.dataset_pipeline import BuildDataset

    # heavy: imports apache_beam; only here, where it is needed
    from maskstream.pipelines.read_corpus import FingerprintFiles, ReadCorpus

    version = version or new_version_name()
    dry_run = is_dry_run(beam_args)  # the job is built, not run: nothing is read or written
    seeds, seeds_raw, seeds_content = read_seeds(seeds_json)
    if not dry_run:
        check_word_stats(stats)
        version_url = prepare_version(root, version)
    # The corpus's fingerprint is computed by the workers (FingerprintFiles): the launching process
    # reads no corpus byte and no word of the statistics.
    fields = manifest_fields(version, config, seeds, {}, {"input": list(inputs), "stats": stats,
                                                          "seeds": seeds_json, "beam_args": list(beam_args)})
    if not dry_run:
        write_atomically(join(version_url, SEEDS_NAME), seeds_raw)
    started = time.perf_counter()
    pipeline = beam.Pipeline(options=PipelineOptions(list(beam_args)))
    corpus = pipeline | "ReadCorpus" >> ReadCorpus(inputs, text_field=text_field, txt_mode=txt_mode)
    fingerprint = corpus["files"] | "FingerprintCorpus" >> FingerprintFiles()
    _ = {**corpus, "fingerprint": fingerprint} | "BuildDataset" >> BuildDataset(config, stats, seeds, root, fields,
                                                                                   peer_signals)
    if dry_run:
        return {"dry_run": job_size(pipeline.run()).line("build")}
    LOG.info("building %s from the word statistics in %s, %d seeds, min word count %d", version_url, stats,
             len(seeds), config.min_word_count)
    result = pipeline.run()
    result.wait_until_finish()
    report = stage_report(result, time.perf_counter() - started)
    if not manifest_exists(version_url):
        raise ValueError(f"no document of {' '.join(inputs)} gave a sequence: nothing to write (the reasons: "
                         f"{version_url}/rejects-*.jsonl)" + "".join(f"\n  {line}" for line in first_rejects(version_url)))
    warn_if_seeds_from_another_corpus(version_url, seeds_content)
    return {**report, "version_url": version_url}



def manifest_exists(version_url: str) -> bool:

    fs, path = fsspec.core.url_to_fs(f"{version_url}/{MANIFEST_NAME}")
    return fs.exists(path)


def first_rejects(version_url: str, count: int = 5) -> list[str]:
    """The first `count` lines of the version's rejects (read line by line, not whole)."""
    fs, path = fsspec.core.url_to_fs(version_url)
    lines: list[str] = []
    for name in sorted(fs.glob(f"{path}/rejects-*.jsonl")):
        with fs.open(name, "r", encoding="utf-8") as f:
            lines.extend(line.rstrip("\n") for _, line in zip(range(count - len(lines)), f, strict=False))
    return lines


def stage_report(result, elapsed_s: float) -> dict[str, Any]:
    """Counters and per-stage seconds the pipeline recorded (Beam metrics)."""

    counters = pipeline_counters(result, "build")
    stages = {k.removesuffix("_ms"): round(v / 1000, 3) for k, v in counters.items() if k.endswith("_ms")}
    counts = {k: v for k, v in counters.items() if not k.endswith("_ms")}
    return {"elapsed_s": round(elapsed_s, 3), "stage_cpu_s": stages, "counts": counts}

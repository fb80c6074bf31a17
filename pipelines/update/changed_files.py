"""The update's per-file step: a cache entry (word counts, tokenized documents, rejects) for every
input file that has none, in the update's own process when the changed files are small, else by a
Beam pipeline over those files only (process_files.py), which a multi-worker runner spreads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer
from maskstream.pipelines.dataset.steps import pipeline_counters
from maskstream.pipelines.update.cache import count_and_tokenize_file, parse_file

# Changed input up to this size is counted and tokenized in one process; above it, by a Beam
# pipeline. Measured by benchmarks/small_update.py (docs/updates.md): two DirectRunner workers catch
# up with one process at 43 MB; more workers catch up sooner.
IN_PROCESS_MAX_BYTES = 32 << 20


def in_process(changed_bytes: int) -> bool:
    return changed_bytes <= IN_PROCESS_MAX_BYTES


def count_and_tokenize(missing: dict[str, str], changed_bytes: int, cache_url: str, config: Any, text_field: str,
                       txt_mode: str, beam_args: list[str], counted: Callable[[Any], None]) -> dict[str, int]:
    """Writes the cache entry of every file of `missing` (path -> cache key); returns the counters.
    `counted(words)` is called with each file's words as soon as this process has counted them."""
    counters = {"files_processed": 0, "documents_tokenized": 0}
    if in_process(changed_bytes):
        tokenizer = load_backend_tokenizer(config.tokenizer)
        for path, key in sorted(missing.items()):
            documents, rejects = parse_file(path, text_field, txt_mode)
            done = count_and_tokenize_file(path, key, documents, rejects, cache_url, tokenizer,
                                           config.tokenize_batch_size, counted=counted)
            counters["files_processed"] += 1
            counters["documents_tokenized"] += done["documents"]
        return counters
    # Heavy (Beam's runner, about a second of imports): only for changes this large.
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    # heavy: imports apache_beam; only here, where it is needed
    from maskstream.pipelines.update.process_files import ProcessFiles

    pipeline = beam.Pipeline(options=PipelineOptions(list(beam_args)))
    _ = pipeline | "ProcessFiles" >> ProcessFiles(missing, cache_url, config.tokenizer, text_field, txt_mode,
                                                  config.tokenize_batch_size)
    result = pipeline.run()
    result.wait_until_finish()
    return {**counters, **pipeline_counters(result, "update")}

"""`ReadCorpus` and `FingerprintFiles`: the corpus reader of `maskstream.pipelines.corpus` as Beam transforms.

A file is read by one worker, streamed record by record (its line and row numbers need a
sequential pass); a corpus is parallel across its files, so shard large corpora into many.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io import fileio

from maskstream.pipelines.corpus import (
    DOCUMENTS,
    FILES,
    MAX_DOCUMENT_BYTES,
    REJECTS,
    TXT_MODES,
    Document,
    FileParser,
    expand_inputs,
    file_digest,
    fingerprint_of,
)


class FingerprintFiles(beam.PTransform):
    """PCollection of file paths -> one `fingerprint_of` dict, each file hashed on a worker."""

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        return (
            files
            | "HashFiles" >> beam.Map(file_digest)
            | "AllFiles" >> beam.combiners.ToList()  # one small entry per file, not per document
            | "Fingerprint" >> beam.Map(fingerprint_of)
        )


class ParseFileFn(beam.DoFn):
    """A `fileio.ReadableFile` -> `Document`s (`FileParser`), and rejects on the `rejects` output."""

    def __init__(self, text_field: str = "text", txt_mode: str = "line", max_document_bytes: int = MAX_DOCUMENT_BYTES):
        self._parser = FileParser(text_field, txt_mode, max_document_bytes)

    def process(self, readable: fileio.ReadableFile) -> Iterator[Any]:
        for record in self._parser.records(readable.metadata.path):
            yield record if isinstance(record, Document) else beam.pvalue.TaggedOutput(REJECTS, record)


class ReadCorpus(beam.PTransform):
    """Files matching `patterns` -> `{"documents": PCollection[Document], "rejects": PCollection[dict],
    "files": PCollection[str] (the paths read, for `FingerprintFiles`)}`.

    `.txt`: a document per line (`txt_mode="line"`) or per file (`txt_mode="file"`);
    `.jsonl`: the string field `text_field` of each line's JSON object;
    `.parquet`: the string column `text_field`, a document per row.
    The file list is fixed when the pipeline is built (`expand_inputs`), so a missing input fails
    before anything runs, and the fingerprint and the pipeline see the same files.
    """

    def __init__(self, patterns: Sequence[str], text_field: str = "text", txt_mode: str = "line",
                 max_document_bytes: int = MAX_DOCUMENT_BYTES):
        super().__init__()
        self.max_document_bytes = max_document_bytes
        if txt_mode not in TXT_MODES:
            raise ValueError(f"txt_mode must be one of {TXT_MODES}, not {txt_mode!r}")
        self.patterns = list(patterns)
        self.text_field = text_field
        self.txt_mode = txt_mode

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        # The file list is part of the job: a path (tens of bytes) per file, never their content.
        files = pbegin | "ListFiles" >> beam.Create(expand_inputs(self.patterns))
        parsed = (
            files
            # Spread the files over workers before the (per-file sequential) parsing.
            | "SpreadFiles" >> beam.Reshuffle()
            | "OpenFiles" >> fileio.ReadMatches()
            | "ParseFiles"
            >> beam.ParDo(ParseFileFn(self.text_field, self.txt_mode, self.max_document_bytes)).with_outputs(REJECTS, main=DOCUMENTS)
        )
        return {DOCUMENTS: parsed[DOCUMENTS], REJECTS: parsed[REJECTS], FILES: files}

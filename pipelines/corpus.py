"""Reading a text corpus into documents, with every bad record kept as a reject.

`ReadCorpus` turns local paths or `gs://` globs of `.txt`, `.jsonl` and `.parquet` files
(optionally compressed, e.g. `.jsonl.gz`) into `Document`s. Nothing is dropped silently:
each record that cannot become a document (bytes that are not UTF-8, an empty document, a
JSONL line that is not a JSON object or lacks the text field, a Parquet file without the text
column, a file of unknown type) becomes a reject `{"source", "location", "reason"}`, so that
documents read = accepted + rejected. A file without any record, and a compressed file that ends
early (truncated) or is damaged, are rejects too (location `file`), and so is a document over
MAX_DOCUMENT_BYTES (16 MiB), skipped without being held in memory. No single record can fail the
job: any exception while one record is parsed (a JSON line nested thousands of levels deep raises
RecursionError, an integer of 5,000 digits ValueError) rejects that record with the exception as
its reason, and the file goes on.

A file is read by one worker, streamed record by record (its line and row numbers need a
sequential pass); a corpus is parallel across its files, so shard large corpora into many.
"""

from __future__ import annotations

import bz2
import contextlib
import functools
import gzip
import hashlib
import io
import json
import lzma
import os
import posixpath
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressedFile, CompressionTypes
from apache_beam.io.filesystems import FileSystems

TXT_MODES = ("line", "file")
DOCUMENTS = "documents"
REJECTS = "rejects"
FILES = "files"
PARQUET_BATCH_ROWS = 1024
# Documents above this size are rejected, unread: tokenizing one costs the build about 100x its size
# in memory (a 50 MB line took over 6 GB), and every process holds a whole document. A book is a
# few MB; split anything larger (e.g. a dump on one line) into documents.
MAX_DOCUMENT_BYTES = 16 * 2**20


class Document(NamedTuple):
    document_id: str  # "<source>:line N", "<source>:row N" or "<source>:file" (1-based)
    source: str  # the file's path or URL
    text: str


def _reject(source: str, location: str, reason: str) -> dict[str, str]:
    return {"source": source, "location": location, "reason": reason}


def file_format(path: str) -> str | None:
    """'txt', 'jsonl' or 'parquet' from the file name (a compression suffix is ignored), else None."""
    name = posixpath.basename(path).lower()
    for suffix in (".gz", ".bz2", ".zst", ".zstd", ".deflate", ".lzma", ".xz"):
        if name.endswith(suffix) and not name.endswith(".parquet" + suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith(".txt"):
        return "txt"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return None


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """The sorted, de-duplicated files that `patterns` (paths or globs, local or `gs://`) match.

    A local folder stands for the files directly in it; folders themselves are never inputs.

    Raises FileNotFoundError naming every pattern that matches no file.
    """
    if not patterns:
        raise FileNotFoundError("no input given")
    files: set[str] = set()
    unmatched: list[str] = []
    for pattern in patterns:
        local = FileSystems.get_scheme(pattern) in (None, "file")
        try:
            # A local folder stands for the files in it.
            (result,) = FileSystems.match([posixpath.join(pattern, "*") if local and os.path.isdir(pattern) else pattern])
            paths = [m.path for m in result.metadata_list
                     if not m.path.endswith(("/", "\\")) and not (local and os.path.isdir(m.path))]
        except Exception:  # Beam raises BeamIOError (or an OSError) for a path it cannot list
            paths = []
        if not paths:
            unmatched.append(pattern)
        files.update(paths)
    if unmatched:
        raise FileNotFoundError(f"input not found: {', '.join(unmatched)} (matches no file)")
    return sorted(files)


def file_digest(path: str) -> dict[str, Any]:
    """`{"path", "bytes", "sha256"}` of one file, hashed as stored (compressed files as they are)."""
    digest = hashlib.sha256()
    size = 0
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return {"path": path, "bytes": size, "sha256": digest.hexdigest()}


def fingerprint_of(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`{"files": [...], "sha256": ...}` of `file_digest` entries. The overall `sha256` is taken
    over the files' sorted content hashes, so it identifies the corpus's content wherever it lives
    (a local copy and a `gs://` copy share it)."""
    entries = sorted(entries, key=lambda e: e["path"])
    overall = hashlib.sha256("\n".join(sorted(e["sha256"] for e in entries)).encode("ascii"))
    return {"files": entries, "sha256": overall.hexdigest()}


def corpus_fingerprint(patterns: Sequence[str]) -> dict[str, Any]:
    """The fingerprint (`fingerprint_of`) of the files `patterns` match, computed in this process.

    It reads every byte of the corpus: the in-process commands (`update`, `watch`) use it; the
    Beam commands compute the same fingerprint on their workers (`FingerprintFiles`), so that the
    launching process reads no corpus bytes."""
    return fingerprint_of([file_digest(path) for path in expand_inputs(patterns)])


class FingerprintFiles(beam.PTransform):
    """PCollection of file paths -> one `fingerprint_of` dict, each file hashed on a worker."""

    def expand(self, files: beam.PCollection) -> beam.PCollection:
        return (
            files
            | "HashFiles" >> beam.Map(file_digest)
            | "AllFiles" >> beam.combiners.ToList()  # one small entry per file, not per document
            | "Fingerprint" >> beam.Map(fingerprint_of)
        )


def _decode(raw: bytes, first: bool) -> str:
    """Strict UTF-8 (a byte-order mark at the start of a file is dropped)."""
    return raw.decode("utf-8-sig" if first else "utf-8")


def _utf8_reason(error: UnicodeDecodeError) -> str:
    return f"not UTF-8: byte 0x{error.object[error.start]:02x} at offset {error.start}"


# Python's decompressors raise these where a compressed stream ends early (a truncated file) or is
# damaged; Beam's own decompressing reader stops silently at the end of the bytes.
TRUNCATED_STREAM_ERRORS = (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)
PYTHON_DECOMPRESSORS = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    ".bz2": bz2.BZ2File,
    ".xz": lzma.LZMAFile,
    ".lzma": lzma.LZMAFile,
}


@contextlib.contextmanager
def _open_binary(readable: fileio.ReadableFile) -> Iterator[io.IOBase]:
    """The file's content as a binary stream: gzip, bzip2 and xz decompressed by Python's modules,
    which report truncation (TRUNCATED_STREAM_ERRORS); other compressions by Beam's reader."""
    name = readable.metadata.path.lower()
    decompressor = next((d for suffix, d in PYTHON_DECOMPRESSORS.items() if name.endswith(suffix)), None)
    if decompressor is None:
        with readable.open(mime_type="application/octet-stream") as f:
            yield f
        return
    uncompressed = CompressionTypes.UNCOMPRESSED
    with readable.open(mime_type="application/octet-stream", compression_type=uncompressed) as raw, decompressor(raw) as f:
        yield f


def _location(record: Document | dict[str, str]) -> str:
    return record["location"] if isinstance(record, dict) else record.document_id.rsplit(":", 1)[1]


def _too_long(size: int, limit: int) -> str:
    return (f"document of {size} bytes is over the {limit / 2**20:g} MiB limit (pipelines.corpus.MAX_DOCUMENT_BYTES); "
            "split it into smaller documents")


def _parsed(source: str, location: str, parse: Callable[[], Document | dict[str, str]]) -> Document | dict[str, str]:
    """`parse()`'s document or reject; any exception it raises rejects this one record, with the
    exception as the reason, instead of failing the job (the file's other records go on)."""
    try:
        return parse()
    except RecursionError:
        return _reject(source, location, "nested too deep to parse (RecursionError)")
    except Exception as e:  # one record is never worth the job: hostile input raises anything
        return _reject(source, location, f"cannot parse the record: {type(e).__name__}: {str(e)[:200]}")


def _lines(f: io.IOBase, limit: int) -> Iterator[tuple[int, bytes | int]]:
    """(1-based line number, line without its end-of-line) for every line of a binary stream; a
    line over `limit` bytes is skipped without being held, and its size is given instead."""
    # Beam's CompressedFile (zstd, deflate) reads whole lines only; other streams stop at the limit.
    readline = f.readline if isinstance(f, CompressedFile) else functools.partial(f.readline, limit + 2)
    for number, raw in enumerate(iter(readline, b""), start=1):
        line = raw.rstrip(b"\r\n")
        if len(line) <= limit:
            yield number, line
            continue
        size = len(line)
        while not raw.endswith(b"\n") and (raw := readline()):
            size += len(raw.rstrip(b"\r\n"))
        yield number, size


class ParseFileFn(beam.DoFn):
    """A `fileio.ReadableFile` -> `Document`s, and rejects on the `rejects` output."""

    def __init__(self, text_field: str = "text", txt_mode: str = "line", max_document_bytes: int = MAX_DOCUMENT_BYTES):
        if txt_mode not in TXT_MODES:
            raise ValueError(f"txt_mode must be one of {TXT_MODES}, not {txt_mode!r}")
        self.text_field = text_field
        self.txt_mode = txt_mode
        self.max_document_bytes = max_document_bytes

    def process(self, readable: fileio.ReadableFile) -> Iterator[Any]:
        source = readable.metadata.path
        kind = file_format(source)
        if kind == "txt" and self.txt_mode == "file":
            records = self._txt_file(readable, source)
        elif kind == "txt":
            records = self._txt_lines(readable, source)
        elif kind == "jsonl":
            records = self._jsonl(readable, source)
        elif kind == "parquet":
            records = self._parquet(readable, source)
        else:
            records = iter([_reject(source, "file", "unsupported file type (expected .txt, .jsonl or .parquet)")])
        last = None
        try:
            for record in records:
                last = record
                yield record if isinstance(record, Document) else beam.pvalue.TaggedOutput(REJECTS, record)
        except TRUNCATED_STREAM_ERRORS as e:
            where = "at its start" if last is None else f"after {_location(last)}"
            reason = f"compressed data ends early or is corrupt {where}, the rest is lost: {type(e).__name__}: {e}"
            yield beam.pvalue.TaggedOutput(REJECTS, _reject(source, "file", reason))
            return
        if last is None:
            # A file with no records at all: not an error, but never silent.
            yield beam.pvalue.TaggedOutput(REJECTS, _reject(source, "file", "empty file (no documents)"))

    @staticmethod
    def _document(source: str, location: str, text: str) -> Document | dict[str, str]:
        if not text.strip():
            return _reject(source, location, "empty document")
        return Document(f"{source}:{location}", source, text)

    def _txt_file(self, readable: fileio.ReadableFile, source: str) -> Iterator[Document | dict[str, str]]:
        limit = self.max_document_bytes
        with _open_binary(readable) as f:
            raw = f.read(limit + 1)
            if len(raw) > limit:
                size = len(raw)
                while chunk := f.read(1 << 20):
                    size += len(chunk)
                yield _reject(source, "file", _too_long(size, limit))
                return
        try:
            yield self._document(source, "file", _decode(raw, first=True))
        except UnicodeDecodeError as e:
            yield _reject(source, "file", _utf8_reason(e))

    def _txt_lines(self, readable: fileio.ReadableFile, source: str) -> Iterator[Document | dict[str, str]]:
        with _open_binary(readable) as f:
            for number, raw in _lines(f, self.max_document_bytes):
                location = f"line {number}"
                if isinstance(raw, int):
                    yield _reject(source, location, _too_long(raw, self.max_document_bytes))
                    continue
                yield _parsed(source, location, functools.partial(self._txt_line, source, location, raw, number == 1))

    def _txt_line(self, source: str, location: str, raw: bytes, first: bool) -> Document | dict[str, str]:
        try:
            return self._document(source, location, _decode(raw, first=first))
        except UnicodeDecodeError as e:
            return _reject(source, location, _utf8_reason(e))

    def _jsonl(self, readable: fileio.ReadableFile, source: str) -> Iterator[Document | dict[str, str]]:
        with _open_binary(readable) as f:
            for number, raw in _lines(f, self.max_document_bytes):
                location = f"line {number}"
                if isinstance(raw, int):
                    yield _reject(source, location, _too_long(raw, self.max_document_bytes))
                    continue
                yield _parsed(source, location, functools.partial(self._jsonl_line, source, location, raw, number == 1))

    def _jsonl_line(self, source: str, location: str, raw: bytes, first: bool) -> Document | dict[str, str]:
        field = self.text_field
        try:
            record = json.loads(_decode(raw, first=first))
        except UnicodeDecodeError as e:
            return _reject(source, location, _utf8_reason(e))
        except json.JSONDecodeError as e:
            return _reject(source, location, f"not JSON: {e.msg} at column {e.colno}")
        if not isinstance(record, dict):
            return _reject(source, location, f"not a JSON object but {type(record).__name__}")
        if field not in record:
            return _reject(source, location, f"no field {field!r}")
        if not isinstance(record[field], str):
            return _reject(source, location, f"field {field!r} is {type(record[field]).__name__}, not a string")
        return self._document(source, location, record[field])

    def _parquet(self, readable: fileio.ReadableFile, source: str) -> Iterator[Document | dict[str, str]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        field = self.text_field
        with readable.open(mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED) as f:
            try:
                parquet = pq.ParquetFile(f)
            except (pa.ArrowInvalid, OSError) as e:
                yield _reject(source, "file", f"not a Parquet file: {e}")
                return
            schema = parquet.schema_arrow
            if field not in schema.names:
                yield _reject(source, "file", f"no column {field!r} (columns: {', '.join(schema.names)})")
                return
            column_type = schema.field(field).type
            is_text = pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
            is_bytes = pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type)
            if not (is_text or is_bytes):
                yield _reject(source, "file", f"column {field!r} is {column_type}, not a string")
                return
            # Read as bytes (a cast that does not validate) and decoded row by row: a string column may
            # hold bytes that are not UTF-8, which would fail a whole batch's conversion.
            as_bytes = pa.large_binary() if pa.types.is_large_string(column_type) else pa.binary()
            batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[field])
            row = 0
            while True:
                try:
                    batch = next(batches, None)
                except (pa.ArrowException, OSError) as e:
                    if isinstance(e, OSError) and e.errno is not None:
                        raise  # the storage failed, not the data: Beam retries, or the job says why
                    # Arrow reports a damaged page as an OSError without errno: the rows before it stand.
                    where = "at its start" if row == 0 else f"after row {row}"
                    yield _reject(source, "file", f"Parquet data unreadable {where}, the rest is lost: {e}")
                    return
                if batch is None:
                    break
                column = batch.column(0).cast(as_bytes) if is_text else batch.column(0)
                for value in column.to_pylist():
                    row += 1
                    location = f"row {row}"
                    yield _parsed(source, location, functools.partial(self._parquet_value, source, location, value))

    def _parquet_value(self, source: str, location: str, value: bytes | None) -> Document | dict[str, str]:
        if value is None:
            return _reject(source, location, f"column {self.text_field!r} is null")
        if len(value) > self.max_document_bytes:
            return _reject(source, location, _too_long(len(value), self.max_document_bytes))
        try:
            return self._document(source, location, value.decode("utf-8"))
        except UnicodeDecodeError as e:
            return _reject(source, location, _utf8_reason(e))


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

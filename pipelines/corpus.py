"""Reading a text corpus into documents, with every bad record kept as a reject.

`FileParser` turns a local or `gs://` file of `.txt`, `.jsonl` or `.parquet` (optionally
compressed, e.g. `.jsonl.gz`) into `Document`s; `expand_inputs` lists the files of paths, folders
and globs, `corpus_fingerprint` hashes them. Beam runs them on workers (`maskstream.pipelines.read_corpus`:
`ReadCorpus`, `FingerprintFiles`); `maskstream update` runs them in its own process, where local
files are read without importing Beam (`open_stored`). Nothing is dropped silently:
each record that cannot become a document (bytes that are not UTF-8, an empty document, a
JSONL line that is not a JSON object or lacks the text field, a Parquet file without the text
column, a file of unknown type) becomes a reject `{"source", "location", "reason"}`, so that
documents read = accepted + rejected. A file without any record, and a compressed file that ends
early (truncated) or is damaged, are rejects too (location `file`), and so is a document over
MAX_DOCUMENT_BYTES (16 MiB), skipped without being held in memory. No single record can fail the
job: any exception while one record is parsed (a JSON line nested thousands of levels deep raises
RecursionError, an integer of 5,000 digits ValueError) rejects that record with the exception as
its reason, and the file goes on.
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
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, NamedTuple

from maskstream.schemas.manifest import sha256_stream

TXT_MODES = ("line", "file")
DOCUMENTS = "documents"
REJECTS = "rejects"
FILES = "files"
PARQUET_BATCH_ROWS = 1024
# Documents above this size are rejected, unread: tokenizing one costs the build many times its size
# in memory (docs/scale.md), and every process holds a whole document. A book is a few MB; split
# anything larger (e.g. a dump on one line) into documents.
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


# What Beam's FileSystems take for a remote path: "scheme://...".
REMOTE_PATH = re.compile(r"^[a-zA-Z][-a-zA-Z0-9+.]*://")
GLOB_CHARACTERS = re.compile(r"[*?[]")
# Compressions no Python module here reads: Beam's reader decompresses them (by suffix).
BEAM_DECOMPRESSED = (".zst", ".zstd", ".deflate")


def is_local(path: str) -> bool:
    return REMOTE_PATH.match(path) is None


def beam_decompresses(path: str) -> bool:
    """Whether Beam's reader decompresses this file (its CompressedFile reads whole lines only)."""
    return path.lower().endswith(BEAM_DECOMPRESSED)


def open_stored(path: str, decompress: bool = False) -> contextlib.AbstractContextManager[IO[bytes]]:
    """A binary stream of the file: its bytes as stored, or with `decompress` as Beam's reader
    gives them (`.zst`, `.deflate` decompressed). Local files are opened by Python, without
    importing Beam (`maskstream update` reads them in its own process); remote ones (`gs://`) and
    Beam's compressions by Beam's FileSystems."""
    if is_local(path) and not (decompress and beam_decompresses(path)):
        return open(path, "rb")
    # heavy: Beam loads only when a pipeline runs (--help and the trainer never import it)
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    compression = CompressionTypes.AUTO if decompress else CompressionTypes.UNCOMPRESSED
    return FileSystems.open(path, mime_type="application/octet-stream", compression_type=compression)


def _local_files(pattern: str) -> list[str] | None:
    """What Beam's FileSystems.match gives for a local path, as `expand_inputs` asks it (a folder
    as FOLDER/*: the files directly in it), without importing Beam: for a path without glob
    characters, or whose last part's only glob character is `*` (`corpus/*.jsonl`, matched as Beam
    matches it: any characters but / and \\). None for other patterns (Beam's to match)."""
    if not is_local(pattern):
        return None
    try:
        if not GLOB_CHARACTERS.search(pattern):
            if not os.path.isdir(pattern):
                return [pattern] if os.path.exists(pattern) else []
            pattern = posixpath.join(pattern, "*")
        folder, name = posixpath.split(pattern)
        if GLOB_CHARACTERS.search(folder) or "?" in name or "[" in name or "**" in name:
            return None
        if not folder or not os.path.isdir(folder):
            return []
        listed = re.compile("[^/\\\\]*".join(re.escape(part) for part in name.split("*")))
        paths = [os.path.join(folder, n) for n in os.listdir(folder) if listed.fullmatch(n)]
        return [path for path in paths if os.path.exists(path) and not os.path.isdir(path)]
    except FileNotFoundError:  # gone while listed
        return []
    except OSError as e:  # a refused permission is no "matches no file" (as for gs://, `_matched_files`)
        raise OSError(f"cannot list {pattern}: {type(e).__name__}: {e}") from e


def _matched_files(pattern: str) -> list[str]:
    """Beam's FileSystems.match of one pattern (a local folder as FOLDER/*), folders left out. An
    error other than not-found (403, a failed login) is raised as an OSError naming the pattern."""
    from apache_beam.io.filesystem import BeamIOError  # heavy: Beam, only for patterns it must list
    from apache_beam.io.filesystems import FileSystems

    local = FileSystems.get_scheme(pattern) in (None, "file")
    try:
        (result,) = FileSystems.match([posixpath.join(pattern, "*") if local and os.path.isdir(pattern) else pattern])
    except BeamIOError as e:  # only "not found" means "matches no file"
        causes = root_causes(e)
        if all(is_not_found(cause) for cause in causes):
            return []
        raise OSError(f"cannot list {pattern}: {type(causes[0]).__name__}: {causes[0]}") from e
    return [m.path for m in result.metadata_list
            if not m.path.endswith(("/", "\\")) and not (local and os.path.isdir(m.path))]


def root_causes(error: BaseException) -> list[BaseException]:
    """The errors under Beam's BeamIOErrors (a match's holds a listing's, which holds the client's)."""
    details = getattr(error, "exception_details", None)
    if not isinstance(details, dict) or not details:
        return [error]
    return [cause for inner in details.values() for cause in root_causes(inner)]


def is_not_found(error: BaseException) -> bool:
    """A missing file, folder or bucket; not a refused permission, a failed login or a network error."""
    return isinstance(error, FileNotFoundError) or getattr(error, "code", None) == 404 or type(error).__name__ == "NotFound"


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
        # A local folder stands for the files in it; most local paths need no Beam.
        paths = _local_files(pattern)
        if paths is None:
            paths = _matched_files(pattern)
        if not paths:
            unmatched.append(pattern)
        files.update(paths)
    if unmatched:
        raise FileNotFoundError(f"input not found: {', '.join(unmatched)} (matches no file)")
    return sorted(files)


def file_digest(path: str) -> dict[str, Any]:
    """`{"path", "bytes", "sha256"}` of one file, hashed as stored (compressed files as they are)."""
    with open_stored(path) as f:
        sha256, size = sha256_stream(f)
    return {"path": path, "bytes": size, "sha256": sha256}


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
def _open_binary(path: str) -> Iterator[io.IOBase]:
    """The file's content as a binary stream: gzip, bzip2 and xz decompressed by Python's modules,
    which report truncation (TRUNCATED_STREAM_ERRORS); other compressions by Beam's reader."""
    name = path.lower()
    decompressor = next((d for suffix, d in PYTHON_DECOMPRESSORS.items() if name.endswith(suffix)), None)
    if decompressor is None:
        with open_stored(path, decompress=True) as f:
            yield f
        return
    with open_stored(path) as raw, decompressor(raw) as f:
        yield f


def _location(record: Document | dict[str, str]) -> str:
    return record["location"] if isinstance(record, dict) else record.document_id.rsplit(":", 1)[1]


def _too_long(size: int, limit: int) -> str:
    return (f"document of {size} bytes is over the {limit / 2**20:g} MiB limit (maskstream.pipelines.corpus.MAX_DOCUMENT_BYTES); "
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


def _lines(f: io.IOBase, limit: int, whole_lines: bool) -> Iterator[tuple[int, bytes | int]]:
    """(1-based line number, line without its end-of-line) for every line of a binary stream; a
    line over `limit` bytes is skipped without being held, and its size is given instead.
    `whole_lines`: the stream reads whole lines only (Beam's CompressedFile: zstd, deflate)."""
    readline = f.readline if whole_lines else functools.partial(f.readline, limit + 2)
    for number, raw in enumerate(iter(readline, b""), start=1):
        line = raw.rstrip(b"\r\n")
        if len(line) <= limit:
            yield number, line
            continue
        size = len(line)
        while not raw.endswith(b"\n") and (raw := readline()):
            size += len(raw.rstrip(b"\r\n"))
        yield number, size


class FileParser:
    """One corpus file -> its `Document`s and rejects (`records`), streamed record by record.
    Beam-free: `maskstream.pipelines.read_corpus.ParseFileFn` runs it on workers, `maskstream update` in
    its own process."""

    def __init__(self, text_field: str = "text", txt_mode: str = "line", max_document_bytes: int = MAX_DOCUMENT_BYTES):
        if txt_mode not in TXT_MODES:
            raise ValueError(f"txt_mode must be one of {TXT_MODES}, not {txt_mode!r}")
        self.text_field = text_field
        self.txt_mode = txt_mode
        self.max_document_bytes = max_document_bytes

    def records(self, source: str) -> Iterator[Document | dict[str, str]]:
        """The file's documents and rejects (dicts), in file order; a file without any record
        and a compressed file that ends early are rejects of their own (location `file`)."""
        kind = file_format(source)
        if kind == "txt" and self.txt_mode == "file":
            records = self._txt_file(source)
        elif kind == "txt":
            records = self._txt_lines(source)
        elif kind == "jsonl":
            records = self._jsonl(source)
        elif kind == "parquet":
            records = self._parquet(source)
        else:
            records = iter([_reject(source, "file", "unsupported file type (expected .txt, .jsonl or .parquet)")])
        last = None
        try:
            for record in records:
                last = record
                yield record
        except TRUNCATED_STREAM_ERRORS as e:
            where = "at its start" if last is None else f"after {_location(last)}"
            reason = f"compressed data ends early or is corrupt {where}, the rest is lost: {type(e).__name__}: {e}"
            yield _reject(source, "file", reason)
            return
        if last is None:
            # A file with no records at all: not an error, but never silent.
            yield _reject(source, "file", "empty file (no documents)")

    @staticmethod
    def _document(source: str, location: str, text: str) -> Document | dict[str, str]:
        if not text.strip():
            return _reject(source, location, "empty document")
        return Document(f"{source}:{location}", source, text)

    def _txt_file(self, source: str) -> Iterator[Document | dict[str, str]]:
        limit = self.max_document_bytes
        with _open_binary(source) as f:
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

    def _txt_lines(self, source: str) -> Iterator[Document | dict[str, str]]:
        return self._each_line(source, self._txt_line)

    def _each_line(self, source: str, parse_line: Callable[[str, str, bytes, bool], Document | dict[str, str]]
                   ) -> Iterator[Document | dict[str, str]]:
        """`parse_line(source, location, raw, first)` of every line of a .txt or .jsonl file; an
        over-long line is a reject, read in bounded memory."""
        with _open_binary(source) as f:
            for number, raw in _lines(f, self.max_document_bytes, beam_decompresses(source)):
                location = f"line {number}"
                if isinstance(raw, int):
                    yield _reject(source, location, _too_long(raw, self.max_document_bytes))
                    continue
                yield _parsed(source, location, functools.partial(parse_line, source, location, raw, number == 1))

    def _txt_line(self, source: str, location: str, raw: bytes, first: bool) -> Document | dict[str, str]:
        try:
            return self._document(source, location, _decode(raw, first=first))
        except UnicodeDecodeError as e:
            return _reject(source, location, _utf8_reason(e))

    def _jsonl(self, source: str) -> Iterator[Document | dict[str, str]]:
        return self._each_line(source, self._jsonl_line)

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

    def _parquet(self, source: str) -> Iterator[Document | dict[str, str]]:
        # heavy: this pyarrow module loads only when data is read: importing this module stays light
        import pyarrow as pa
        import pyarrow.parquet as pq

        field = self.text_field
        with open_stored(source) as f:
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

"""Publishing a file: the one way maskstream makes a written file visible to readers.

A file is written under a temporary name beside it (or where the caller says), then moved into
place, so a reader sees the old file or the whole new one, never half of it, and a write that
fails leaves nothing new. Local paths and object stores (`gs://`) go through one API, fsspec:

- local: the temporary file is renamed over the final name (atomic on one filesystem);
- an object store: the bytes are uploaded as one object once written, which is atomic there
  (an upload closed by an error would publish half of it, so nothing is streamed).

`move_into_place` is the move itself, for a file or folder finished elsewhere (a checksummed
download, a Beam staging folder, a checkpoint's folder).
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import uuid
from collections.abc import Iterator
from typing import IO

import fsspec
from fsspec.implementations.local import LocalFileSystem


def is_local(url: str) -> bool:
    fs, _ = fsspec.core.url_to_fs(url)
    return isinstance(fs, LocalFileSystem)


@contextlib.contextmanager
def open_atomically(url: str, *, aside: str | None = None) -> Iterator[IO[bytes]]:
    """A binary stream to write `url` with, published when the block ends without an error.

    `aside` is where a local file is written before the move (default: beside `url`, under a
    unique name); raising inside the block (a checksum that does not match, say) removes it and
    publishes nothing. The parent folder is created if missing."""
    fs, path = fsspec.core.url_to_fs(url)
    if not isinstance(fs, LocalFileSystem):
        buffer = io.BytesIO()
        yield buffer
        fs.pipe_file(path, buffer.getvalue())
        return
    fs.makedirs(posixpath.dirname(path) or ".", exist_ok=True)
    temporary = aside if aside is not None else f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(temporary, "wb") as f:
            yield f
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(temporary)
        raise
    move_into_place(temporary, url)


def write_atomically(url: str, data: bytes) -> None:
    """Publishes `data` as the whole of `url`: readers see the old object or the new one."""
    fs, path = fsspec.core.url_to_fs(url)
    if isinstance(fs, LocalFileSystem):
        with open_atomically(url) as f:
            f.write(data)
    else:  # object stores: a single-object upload becomes visible all at once
        fs.pipe_file(path, data)


def move_into_place(source: str, url: str) -> None:
    """Moves a finished file or folder `source` to `url`, replacing a file there (a folder must
    not exist). Local: one rename. An object store: a server-side copy then a delete, each object
    of which appears whole."""
    fs, path = fsspec.core.url_to_fs(url)
    _, source_path = fsspec.core.url_to_fs(source)
    recursive = fs.isdir(source_path)
    if isinstance(fs, LocalFileSystem):
        fs.mv(source_path, path, recursive=recursive)
        return
    # Not fs.mv: gcsfs's first tries the objects.moveTo API, which a bucket without hierarchical namespace
    # (and the GCS emulator) refuses with 501, retried for about 30 s per call before it copies anyway.
    fs.copy(source_path, path, recursive=recursive)
    fs.rm(source_path, recursive=recursive)

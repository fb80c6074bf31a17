"""`trim_malloc`: glibc's malloc keeps the blocks a process frees in its arenas (one per thread that
allocated) for reuse, so a process that runs rebuild after rebuild grows though its live objects do
not. `malloc_trim(0)` hands the free pages back, and fewer arenas (`limit_malloc_arenas`) leave less
of it stranded in partly used pages. No import beyond the standard library: the encoder's process
calls it too."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    return ctypes.CDLL(name) if name else None


def trim_malloc() -> bool:
    """malloc_trim(0) where the C library is glibc; True when it ran."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
WATCH_MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = WATCH_MALLOC_ARENAS) -> bool:
    """glibc's MALLOC_ARENA_MAX for this process from now on (arenas made later); True when it ran."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))

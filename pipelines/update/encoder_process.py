"""The word encoder in a process of its own, started once per process (`maskstream watch` keeps it
between rebuilds): importing torch and transformers and loading the model take seconds of CPU that
hold the GIL, which on a thread beside the statistics slowed both (docs/updates.md, "The encoder in a
process of its own"); a second process uses a second core and imports no Beam. Words and embeddings
cross as arrays."""

from __future__ import annotations

import functools
import gc
import logging
import logging.handlers
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import numpy as np

from maskstream.pipelines.update.malloc import trim_malloc

_LOADED: Any = None  # in the encoder's process: its LoadedEncoder


def _start_encoder_process(records: Any, level: int) -> None:
    """The encoder process's initializer: its log records go to the parent's loggers, and it
    ignores SIGINT and SIGTERM, which a terminal's Ctrl-C or a service manager also sends to it:
    its parent decides (`maskstream watch` finishes the rebuild under way, then stops), and it
    ends with its parent, however that ends (a pool's worker would otherwise wait for work forever
    after a SIGKILL of its parent, holding the model's memory)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        def exit_with_parent() -> None:
            multiprocessing.connection.wait([parent.sentinel])
            os._exit(0)

        threading.Thread(target=exit_with_parent, name="exit-with-parent", daemon=True).start()
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(level)


def _load_in_encoder_process(encoder: Any) -> float:
    """Loads `encoder` (a WordEncoder) in the encoder's process; returns the seconds it took."""
    global _LOADED
    started = time.perf_counter()
    _LOADED = encoder.load()
    # Leave torch's objects out of the collector's passes, the last one at exit included (see cli.run).
    gc.freeze()
    return round(time.perf_counter() - started, 3)


def _encode_in_encoder_process(words: list[str]) -> tuple[list[str], np.ndarray]:
    """(words, float32 embeddings row by row) of `words`, in `word_batches` order."""
    batches = _LOADED.encoder.batches(words)
    try:
        return [w for batch in batches for w in batch], np.concatenate([_LOADED.encode(batch) for batch in batches])
    finally:
        trim_malloc()  # torch's CPU tensors come from glibc's malloc, and `watch` keeps this process


class _RelogHandler(logging.Handler):
    """The encoder process's records, handled by this process's logger of the same name."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


@functools.lru_cache(maxsize=1)
def _encoder_process(encoder: Any) -> tuple[ProcessPoolExecutor, Future]:

    context = multiprocessing.get_context("spawn")  # CUDA-safe, and free of this process's threads
    records = context.Queue()
    logging.handlers.QueueListener(records, _RelogHandler()).start()
    pool = ProcessPoolExecutor(1, mp_context=context, initializer=_start_encoder_process,
                               initargs=(records, logging.getLogger().getEffectiveLevel()))
    return pool, pool.submit(_load_in_encoder_process, encoder)


class EncoderLoader:
    """The word encoder of `config`, started loading in a process of its own, once per process:
    `maskstream watch` keeps it between rebuilds. `encode()` waits for the load and re-raises its
    error (and forgets a failed load)."""

    def __init__(self, config: Any):
        self._pool, self._loading = _encoder_process(config.word_encoder())

    def submit(self, words: Sequence[str]) -> Future:
        """Starts encoding `words` (batched as the build batches them, `word_batches`) once loaded;
        `result()` of the returned future gives their embeddings."""
        return self._pool.submit(_encode_in_encoder_process, list(words))

    def result(self, pending: Future) -> dict[str, np.ndarray]:
        """{word: float32 embedding} of a `submit`; the load's error if it failed."""
        try:
            self._loading.result()
            encoded, vectors = pending.result()
        except BaseException:
            _encoder_process.cache_clear()
            self._pool.shutdown(wait=False, cancel_futures=True)
            raise
        return dict(zip(encoded, vectors, strict=True))

    def load_seconds(self) -> float | None:
        """Seconds the load took (in the background), None while it runs or if it failed."""
        if not self._loading.done() or self._loading.exception() is not None:
            return None
        return self._loading.result()

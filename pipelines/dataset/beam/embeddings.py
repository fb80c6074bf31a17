"""Static word embeddings and nearest-seed similarity.

Every word type is encoded once, on its own (`[CLS] word [SEP]`), and pooled: `mean` over the
word's own tokens (specials excluded; the default) or the model's `pooler` output
(`maskstream.pipelines.dataset.core.word_encoder`, Beam-free). Encoding runs in Beam's `RunInference` with
`WordEncoderHandler`, in batches of ~256 words (sorted by length, at most 16 tokens each, words of
one token count per batch), so the cost grows with the vocabulary, not with the corpus.

Similarity of a word to the seeds is the cosine of their embeddings, reduced by
- `max`: to the nearest seed (the paper's default),
- `mean`: the mean cosine over all seeds,
- `centroid`: the cosine to the mean of the unit-length seed embeddings.
`nearest_seed` is always the seed with the highest cosine.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference

from maskstream.pipelines.dataset.core.word_encoder import LoadedEncoder, WordEncoder
from maskstream.pipelines.dataset.steps import nearest_seed_rows


class WordEncoderHandler(ModelHandler[str, PredictionResult, LoadedEncoder]):
    """RunInference handler: a batch of words (one of `word_batches`) -> one float32 embedding per
    word, by `encoder`."""

    def __init__(self, encoder: WordEncoder):
        super().__init__()
        self._encoder = encoder
        self._calls = beam.metrics.Metrics.counter("build", "encoder_calls")
        self._words = beam.metrics.Metrics.counter("build", "encoded_words")
        self._ms = beam.metrics.Metrics.counter("build", "encode_ms")

    def load_model(self) -> LoadedEncoder:
        return self._encoder.load()

    def run_inference(self, batch: Sequence[str], model: LoadedEncoder, inference_args=None) -> Iterable[PredictionResult]:
        started = time.perf_counter()
        embeddings = model.encode(batch)
        self._calls.inc()
        self._words.inc(len(batch))
        self._ms.inc(int((time.perf_counter() - started) * 1000))
        return [PredictionResult(word, embedding) for word, embedding in zip(batch, embeddings, strict=True)]

    @property
    def encoder(self) -> WordEncoder:
        return self._encoder

    def get_num_bytes(self, batch: Sequence[str]) -> int:
        return sum(len(w.encode("utf-8")) for w in batch)

    def get_metrics_namespace(self) -> str:
        return "maskstream_encoder"


class EmbedWords(beam.PTransform):
    """PCollection[list[str]] of word batches -> PCollection[(word, float32 embedding)].

    The batches come from `word_batches` (fixed composition, words of one token count
    together), not from BatchElements: a word's embedding then does not depend on which words
    shared its batch (padding and matrix shapes), so results are identical for any number of
    workers.
    """

    def __init__(self, handler: WordEncoderHandler):
        super().__init__()
        self._handler = handler

    def expand(self, word_batches):
        return (
            word_batches
            | "Encode" >> RunInference(self._handler.with_no_batching())
            | "ToPairs" >> beam.Map(lambda result: (result.example, np.asarray(result.inference, np.float32)))
        )


class NearestSeedRowsFn(beam.DoFn):
    """Batches of (word, embedding) -> a table of word-table rows (WORD_TABLE_SCHEMA) of those in
    the vocabulary (`WordLookup`), scored against the seed embeddings."""

    def __init__(self, reduce: str):
        self._reduce = reduce

    def process(self, batch: Sequence[tuple[str, np.ndarray]], seeds: list[tuple[str, np.ndarray]], lookup):
        known = lookup.index_of([word for word, _ in batch]) >= 0
        words = [pair for pair, k in zip(batch, known, strict=True) if k]
        if not words:
            return
        yield nearest_seed_rows([w for w, _ in words], np.stack([e for _, e in words]), seeds, self._reduce, lookup)

"""Static word embeddings and nearest-seed similarity.

Every word type is encoded once, on its own (`[CLS] word [SEP]`), and pooled: `mean` over the
word's own tokens (specials excluded; the default) or the model's `pooler` output. Encoding runs
in Beam's `RunInference` with `WordEncoderHandler`, in batches of ~256 words (sorted by length,
at most 16 tokens each, words of one token count per batch),
so the cost grows with the vocabulary, not with the corpus. The forward pass runs in float32 or
under bfloat16 autocast (`encoder_dtype.resolve_encoder_dtype`: `auto` picks bfloat16 where the device does it
natively); pooling is always done in float32.

Similarity of a word to the seeds is the cosine of their embeddings, reduced by
- `max`: to the nearest seed (the paper's default),
- `mean`: the mean cosine over all seeds,
- `centroid`: the cosine to the mean of the unit-length seed embeddings.
`nearest_seed` is always the seed with the highest cosine.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterable, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference

from pipelines.dataset.encoder_dtype import DTYPES
from schemas.models import MAX_WORD_TOKENS

POOLINGS = ("mean", "pooler")

LOG = logging.getLogger("maskstream.embeddings")


class LoadedEncoder:
    """Tokenizer and model together (RunInference shares the loaded model through a weak reference)."""

    def __init__(self, tokenizer, model):
        self.tokenizer, self.model = tokenizer, model


class WordEncoderHandler(ModelHandler[str, PredictionResult, LoadedEncoder]):
    """RunInference handler: a batch of words -> one float32 embedding per word.

    `dtype` (resolved, see `resolve_encoder_dtype`): `bfloat16` runs the model under bfloat16
    autocast; the pooled embedding is computed and returned in float32 either way."""

    def __init__(self, model_name: str, *, pooling: str = "mean", max_word_tokens: int = MAX_WORD_TOKENS, threads: int = 0,
                 device: str = "auto", batch_rows: int = 0, dtype: str = "float32"):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES} (resolve `auto` first), got {dtype!r}")
        super().__init__()
        self._model_name = model_name
        self._pooling = pooling
        self._max_word_tokens = max_word_tokens
        self._threads = threads
        self._device = device
        # > 0: every batch is padded to this many rows (repeating its last word), so that with
        # `word_batches` each word is always encoded in a batch of the same shape.
        self._batch_rows = batch_rows
        self._dtype = dtype
        self._calls = beam.metrics.Metrics.counter("build", "encoder_calls")
        self._words = beam.metrics.Metrics.counter("build", "encoded_words")
        self._ms = beam.metrics.Metrics.counter("build", "encode_ms")

    def load_model(self):
        import torch
        from transformers import AutoModel

        from maskstream.pretrained import load_pretrained
        from schemas.models import display_name

        if self._threads > 0:  # several worker processes on one machine: avoid oversubscribing its cores
            torch.set_num_threads(self._threads)

        tokenizer = load_word_tokenizer(self._model_name, self._max_word_tokens)
        device = ("cuda" if torch.cuda.is_available() else "cpu") if self._device == "auto" else self._device
        # Words are a few tokens long: plain attention is faster there than the fused SDPA kernels
        # (12% in bfloat16 on CPU), and every model has it.
        # A masked-LM checkpoint has no pooler: said in one line, since only `--pooling pooler` reads it.
        model, _ = load_pretrained(AutoModel, self._model_name, "head",
                                   "unused with --pooling mean" if self._pooling == "mean"
                                   else "--pooling pooler reads it untrained", attn_implementation="eager")
        model = model.to(device)
        model.eval()
        LOG.info("word encoder %s on %s in %s", display_name(self._model_name), device, self._dtype)
        return LoadedEncoder(tokenizer, model)

    def run_inference(self, batch: Sequence[str], model, inference_args=None) -> Iterable[PredictionResult]:
        import torch

        started = time.perf_counter()
        tokenizer, encoder = model.tokenizer, model.model
        rows = list(batch) + list(batch[-1:]) * max(self._batch_rows - len(batch), 0)
        encodings = tokenizer.encode_batch(rows)
        special = torch.tensor([e.special_tokens_mask for e in encodings], device=encoder.device)
        inputs = {"input_ids": torch.tensor([e.ids for e in encodings], device=encoder.device),
                  "attention_mask": torch.tensor([e.attention_mask for e in encodings], device=encoder.device)}
        autocast = (torch.autocast(encoder.device.type, dtype=torch.bfloat16) if self._dtype == "bfloat16"
                    else contextlib.nullcontext())
        with torch.inference_mode():
            with autocast:
                output = encoder(**inputs)
            if self._pooling == "pooler":
                pooled = output.pooler_output.float()
            else:
                own = (inputs["attention_mask"] * (1 - special)).unsqueeze(-1).float()
                pooled = (output.last_hidden_state.float() * own).sum(1) / own.sum(1).clamp(min=1)
        embeddings = pooled.cpu().numpy()[: len(batch)]
        self._calls.inc()
        self._words.inc(len(batch))
        self._ms.inc(int((time.perf_counter() - started) * 1000))
        return [PredictionResult(word, embedding) for word, embedding in zip(batch, embeddings, strict=True)]

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def dtype(self) -> str:
        return self._dtype

    @property
    def batch_rows(self) -> int:
        return self._batch_rows

    @property
    def max_word_tokens(self) -> int:
        return self._max_word_tokens

    def get_num_bytes(self, batch: Sequence[str]) -> int:
        return sum(len(w.encode("utf-8")) for w in batch)

    def get_metrics_namespace(self) -> str:
        return "maskstream_encoder"


@functools.lru_cache(maxsize=4)
def load_word_tokenizer(name: str, max_word_tokens: int):
    """The model's fast tokenizer (Rust backend) set to encode words on their own: special tokens
    around each, truncated to `max_word_tokens` on the model's truncation side, a batch padded
    to its longest word on its padding side. The same ids and masks as the Hugging Face call
    with `padding=True, truncation=True`, without its Python per-token conversions."""
    from tokenizers import Tokenizer

    from pipelines.dataset.sequences import load_backend_tokenizer, load_tokenizer

    hf = load_tokenizer(name)
    tokenizer = Tokenizer.from_str(load_backend_tokenizer(name).to_str())
    tokenizer.enable_truncation(max_word_tokens, direction=hf.truncation_side)
    # A tokenizer without a pad token never pads here (`word_batches` gives a batch one length);
    # the padding would be masked anyway.
    pad = {"pad_id": hf.pad_token_id, "pad_token": hf.pad_token} if hf.pad_token is not None else {}
    tokenizer.enable_padding(direction=hf.padding_side, pad_type_id=hf.pad_token_type_id, **pad)
    return tokenizer


def word_batches(words: Sequence[str], tokenizer_name: str, batch_size: int,
                 max_word_tokens: int = MAX_WORD_TOKENS) -> list[list[str]]:
    """`words` in batches of words with the same number of tokens (so nothing is padded), in a
    fixed order. With a handler whose `batch_rows` is `batch_size`, every word is encoded in a
    batch of the same shape whichever other words are encoded with it, which keeps its embedding
    the same bit for bit in a full build and in an incremental one (small batches and padding can
    change the last bits of a float32 result)."""
    from pipelines.dataset.sequences import load_backend_tokenizer

    ordered = sorted(set(words))
    lengths = [min(len(e.ids), max_word_tokens) for e in load_backend_tokenizer(tokenizer_name).encode_batch(ordered)]
    by_length: dict[int, list[str]] = {}
    for word, length in zip(ordered, lengths, strict=True):
        by_length.setdefault(length, []).append(word)
    return [group[i : i + batch_size] for _, group in sorted(by_length.items())
            for i in range(0, len(group), batch_size)]


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


class ScoreWords(beam.DoFn):
    """Batches of (word, embedding) -> a table of word-table rows (WORD_TABLE_SCHEMA) of those in
    the vocabulary (`WordLookup`), scored against the seed embeddings."""

    def __init__(self, reduce: str):
        self._reduce = reduce

    def process(self, batch: Sequence[tuple[str, np.ndarray]], seeds: list[tuple[str, np.ndarray]], lookup):
        from pipelines.dataset.build_steps import score_words

        known = lookup.index_of([word for word, _ in batch]) >= 0
        words = [pair for pair, k in zip(batch, known, strict=True) if k]
        if not words:
            return
        yield score_words([w for w, _ in words], np.stack([e for _, e in words]), seeds, self._reduce, lookup)

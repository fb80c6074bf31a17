"""The word encoder itself, without Beam: load a model and encode batches of words.

`maskstream.pipelines.dataset.beam.embeddings.WordEncoderHandler` runs it in the build's `RunInference`;
`maskstream update` runs it in a process of its own (`maskstream.pipelines.update.incremental`), which
then imports torch and transformers but not Beam. Both batch words with `word_batches`, so a word's
embedding is the same bit for bit whichever of them encoded it.

Every word type is encoded on its own (`[CLS] word [SEP]`) and pooled: `mean` over the word's own
tokens (specials excluded; the default) or the model's `pooler` output. The forward pass runs in
float32 or under bfloat16 autocast (`encoder_dtype.resolve_encoder_dtype`); pooling is always
done in float32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from maskstream.models import MAX_WORD_TOKENS, display_name, load_pretrained
from maskstream.pipelines.dataset.core.encoder_dtype import DTYPES
from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer, load_tokenizer

POOLINGS = ("mean", "pooler")
DEFAULT_EMBED_BATCH_SIZE = 256  # words per encoder call, every call padded to it (`--embed-batch-size`)

LOG = logging.getLogger("maskstream.embeddings")


@dataclasses.dataclass(frozen=True)
class WordEncoder:
    """How words are encoded: the model, the pooling, where and in which dtype (resolved: `auto`
    is `resolve_encoder_dtype`'s to decide), and `batch_rows`: > 0 pads every batch to this many
    rows (repeating its last word), so that with `word_batches` each word is always encoded in a
    batch of the same shape. `threads` > 0 caps torch's threads (several worker processes on one
    machine)."""

    model_name: str
    pooling: str = "mean"
    max_word_tokens: int = MAX_WORD_TOKENS
    threads: int = 0
    device: str = "auto"
    batch_rows: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES} (resolve `auto` first), got {self.dtype!r}")

    def batches(self, words: Sequence[str]) -> list[list[str]]:
        """`word_batches` of `words` for this encoder."""
        return word_batches(words, self.model_name, self.batch_rows, self.max_word_tokens)

    def load(self) -> LoadedEncoder:
        """Imports torch and transformers and loads the tokenizer and the model (seconds)."""
        # heavy: torch and transformers load only when a model is needed (--help stays fast)
        import torch
        from transformers import AutoModel

        if self.threads > 0:
            torch.set_num_threads(self.threads)
        tokenizer = load_word_tokenizer(self.model_name, self.max_word_tokens)
        device = ("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device
        # Words are a few tokens long: plain attention is faster there than the fused SDPA kernels
        # (12% in bfloat16 on CPU), and every model has it.
        # A masked-LM checkpoint has no pooler: said in one line, since only `--pooling pooler` reads it.
        model, _ = load_pretrained(AutoModel, self.model_name, "head",
                                   "unused with --pooling mean" if self.pooling == "mean"
                                   else "--pooling pooler reads it untrained", attn_implementation="eager")
        model = model.to(device)
        model.eval()
        LOG.info("word encoder %s on %s in %s", display_name(self.model_name), device, self.dtype)
        return LoadedEncoder(self, tokenizer, model)


class LoadedEncoder:
    """A WordEncoder's tokenizer and model, loaded (RunInference shares it through a weak reference)."""

    def __init__(self, encoder: WordEncoder, tokenizer: Any, model: Any):
        self.encoder, self.tokenizer, self.model = encoder, tokenizer, model

    def encode(self, batch: Sequence[str]) -> np.ndarray:
        """One float32 embedding per word of `batch` (a batch of `word_batches`), in its order."""
        # heavy: torch and transformers load only when a model is needed (--help stays fast)
        import torch

        encoder, model = self.encoder, self.model
        rows = list(batch) + list(batch[-1:]) * max(encoder.batch_rows - len(batch), 0)
        encodings = self.tokenizer.encode_batch(rows)
        special = torch.tensor([e.special_tokens_mask for e in encodings], device=model.device)
        inputs = {"input_ids": torch.tensor([e.ids for e in encodings], device=model.device),
                  "attention_mask": torch.tensor([e.attention_mask for e in encodings], device=model.device)}
        autocast = (torch.autocast(model.device.type, dtype=torch.bfloat16) if encoder.dtype == "bfloat16"
                    else contextlib.nullcontext())
        with torch.inference_mode():
            with autocast:
                output = model(**inputs)
            if encoder.pooling == "pooler":
                pooled = output.pooler_output.float()
            else:
                own = (inputs["attention_mask"] * (1 - special)).unsqueeze(-1).float()
                pooled = (output.last_hidden_state.float() * own).sum(1) / own.sum(1).clamp(min=1)
        return pooled.cpu().numpy()[: len(batch)]


@functools.lru_cache(maxsize=4)
def load_word_tokenizer(name: str, max_word_tokens: int):
    """The model's fast tokenizer (Rust backend) set to encode words on their own: special tokens
    around each, truncated to `max_word_tokens` on the model's truncation side, a batch padded
    to its longest word on its padding side. The same ids and masks as the Hugging Face call
    with `padding=True, truncation=True`, without its Python per-token conversions."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    from tokenizers import Tokenizer

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

    ordered = sorted(set(words))
    lengths = [min(len(e.ids), max_word_tokens) for e in load_backend_tokenizer(tokenizer_name).encode_batch(ordered)]
    by_length: dict[int, list[str]] = {}
    for word, length in zip(ordered, lengths, strict=True):
        by_length.setdefault(length, []).append(word)
    return [group[i : i + batch_size] for _, group in sorted(by_length.items())
            for i in range(0, len(group), batch_size)]

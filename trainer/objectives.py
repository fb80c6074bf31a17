"""Training objectives of `maskstream train`, and loading the masked-LM they train.

An objective is a `torch.nn.Module` wrapping the masked-LM; `forward(input_ids, attention_mask,
labels, masked_positions=None, attends_all=False)` returns `{"loss", "nll", "correct", "masked"}`: the loss to minimize, and for held-out
metrics the summed negative log-likelihood of the masked tokens, the correctly predicted masked
tokens and the masked tokens (perplexity = exp(sum nll / sum masked)). Because it is a module, an objective may own parameters of its own; the
training loop wraps it in DDP / torch.compile, gives all its parameters to the optimizer and
checkpoints its whole state. Another objective (e.g. ExLM) is one more entry in `OBJECTIVES`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from maskstream.models import load_pretrained
from maskstream.trainer.exlm import HEAD_ATTRIBUTES, ExLMForMaskedLM

log = logging.getLogger("maskstream.train")

# The `config.model_type`s whose SDPA attention gives the same outputs with the 4-D boolean mask as with the
# 2-D one (tests/trainer/test_objectives.py checks each): only they get it. ModernBERT is not one: it builds
# its sliding-window (local) attention from the 2-D mask, which a 4-D mask skips (issue 75). A type not
# listed gets the 2-D mask, and Hugging Face's host-side check with it.
FOUR_D_MASK_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert"})


def load_mlm_model(model_name: str):
    """A masked-LM from `model_name`. A checkpoint without an MLM head (an encoder saved as
    `BertModel`, like the offline MiniLM) gets a newly initialized head whose output projection is
    the input embedding matrix itself (tied), so only the small transform and bias are new."""
    # heavy: torch and transformers load only when a model is needed (--help stays fast)
    from transformers import AutoModelForMaskedLM

    model, _ = load_pretrained(AutoModelForMaskedLM, model_name, "MLM head", "expected for sentence encoders")
    if model.get_output_embeddings() is not None and model.config.tie_word_embeddings:
        model.tie_weights()
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        log.info("MLM decoder weight %s the input word embeddings", "is tied to" if tied else "is NOT tied to")
    return model


class MaskedLM(torch.nn.Module):
    """Cross-entropy over the masked positions (`labels` != -100), averaged over them.

    When the head is known (`HEAD_ATTRIBUTES`), vocabulary logits are computed only at the masked
    positions (about 15% of them): for a small encoder the vocabulary projection is most of
    the compute and memory of a step. Otherwise the model's own full logits are used.
    """

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.head_attribute = next((name for name in HEAD_ATTRIBUTES if hasattr(model, name)), None)

    def model_attention_mask(self, attention_mask: torch.Tensor, attends_all: bool) -> torch.Tensor | None:
        """The mask the model gets. Hugging Face checks a 2-D mask for padding on the host before SDPA
        (a wait for the device); the 4-D boolean mask it would build from it skips that check, for the
        model types in `FOUR_D_MASK_MODEL_TYPES` only. No mask (`attends_all`) is every type's 2-D all-ones."""
        if attends_all:
            return None
        config = self.model.config
        if getattr(config, "_attn_implementation", None) == "sdpa" and config.model_type in FOUR_D_MASK_MODEL_TYPES:
            length = attention_mask.shape[1]
            return attention_mask.bool()[:, None, None, :].expand(-1, 1, length, -1)
        return attention_mask

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                masked_positions: torch.Tensor | None = None, attends_all: bool = False) -> dict:
        """`masked_positions` (the flat indices of the masked tokens, made where the batch was masked)
        selects them with a shape the host knows; without it, `labels != -100` selects them, and the
        data-dependent shape waits for the device. `attends_all`: the host knows no token is padding,
        so the model gets no mask (Hugging Face would check it on the device, waiting for it too)."""
        model_mask = self.model_attention_mask(attention_mask, attends_all)
        if masked_positions is not None:
            targets = labels.reshape(-1).index_select(0, masked_positions)
            count: torch.Tensor | int = masked_positions.numel()
        else:
            masked = labels != -100
            targets = labels[masked]
            count = masked.sum()
        if self.head_attribute is not None:
            hidden = self.model.base_model(input_ids=input_ids, attention_mask=model_mask).last_hidden_state
        else:
            hidden = self.model(input_ids=input_ids, attention_mask=model_mask).logits
        if masked_positions is not None:
            selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked_positions)
        else:
            selected = hidden[masked]
        logits = getattr(self.model, self.head_attribute)(selected) if self.head_attribute is not None else selected
        # A sum over no masked token is 0 (not nan), and every parameter still takes part.
        nll = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
        loss = nll / (max(count, 1) if isinstance(count, int) else count.clamp(min=1))
        return {"loss": loss, "nll": nll.detach(), "correct": (logits.argmax(-1) == targets).sum(), "masked": count}


OBJECTIVES = {"mlm": MaskedLM, "exlm": ExLMForMaskedLM}

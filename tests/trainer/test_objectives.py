"""The MLM objective against Hugging Face's own masked-LM loss."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from maskstream.trainer.objectives import MaskedLM


def test_masked_lm_loss_equals_the_hf_loss_with_and_without_the_sparse_head():
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32, max_position_embeddings=32)).eval()
    input_ids = torch.randint(5, 50, (3, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 8:] = 0
    labels = torch.where(torch.rand(3, 12) < 0.3, input_ids, torch.full_like(input_ids, -100))
    labels[2, 8:] = -100
    expected = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    objective = MaskedLM(model)
    assert objective.head_attribute == "cls"  # logits only at the masked positions
    out = objective(input_ids, attention_mask, labels)
    assert out["loss"].item() == pytest.approx(expected.loss.item(), rel=1e-5)
    masked = labels != -100
    assert int(out["masked"]) == int(masked.sum())
    assert int(out["correct"]) == int((expected.logits.argmax(-1)[masked] == labels[masked]).sum())
    assert out["nll"].item() == pytest.approx(expected.loss.item() * int(masked.sum()), rel=1e-5)
    objective.head_attribute = None  # the generic path: the model's own full logits
    assert objective(input_ids, attention_mask, labels)["loss"].item() == pytest.approx(expected.loss.item(), rel=1e-5)
    nothing = torch.full_like(labels, -100)
    assert objective(input_ids, attention_mask, nothing)["loss"].item() == 0.0

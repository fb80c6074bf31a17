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


@pytest.mark.parametrize("head", ["cls", None])
def test_masked_positions_from_the_worker_select_what_the_labels_select(head):
    """The positions the loader workers send (`masked_positions`) give the loss, counts and gradients of the
    boolean selection, and a batch with no padding gives the same without its mask (`attends_all`)."""
    from maskstream.trainer.loader import masked_positions

    torch.manual_seed(1)
    model = BertForMaskedLM(BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32, max_position_embeddings=40)).eval()
    objective = MaskedLM(model)
    objective.head_attribute = head
    input_ids = torch.randint(5, 60, (4, 17))  # a width that is no multiple of anything
    labels = torch.where(torch.rand(4, 17) < 0.2, input_ids, torch.full_like(input_ids, -100))
    labels[0] = -100  # a row with nothing masked
    full = torch.ones_like(input_ids)

    def run(*extra):
        objective.zero_grad()
        out = objective(input_ids, full, labels, *extra)
        out["loss"].backward()
        return out, [p.grad.clone() for p in objective.parameters() if p.grad is not None]

    expected, expected_grads = run()
    for extra in ((masked_positions(labels),), (masked_positions(labels), True), (None, True)):
        out, grads = run(*extra)
        assert out["loss"].item() == pytest.approx(expected["loss"].item(), rel=1e-6)
        assert int(out["masked"]) == int(expected["masked"]) and int(out["correct"]) == int(expected["correct"])
        assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(grads, expected_grads, strict=True))
    nothing = torch.full_like(labels, -100)
    assert objective(input_ids, full, nothing, masked_positions(nothing))["loss"].item() == 0.0

"""The MLM objective against Hugging Face's own masked-LM loss."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AlbertConfig,
    AutoModelForMaskedLM,
    BertConfig,
    BertForMaskedLM,
    DistilBertConfig,
    ElectraConfig,
    ModernBertConfig,
    RobertaConfig,
    XLMRobertaConfig,
)

from maskstream.trainer.objectives import FOUR_D_MASK_MODEL_TYPES, MaskedLM


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


TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)
# Every model type whose mask `MaskedLM` decides, as a tiny config. ModernBERT: a 4-token local window, and
# every other layer local (layers 0 and 2 global, 1 local), so rows longer than 4 tokens leave the window.
TINY_CONFIGS = {
    "bert": lambda: BertConfig(**TINY),
    "roberta": lambda: RobertaConfig(**TINY, pad_token_id=1),
    "xlm-roberta": lambda: XLMRobertaConfig(**TINY, pad_token_id=1),
    "distilbert": lambda: DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                           max_position_embeddings=64),
    "electra": lambda: ElectraConfig(**TINY, embedding_size=16),
    "albert": lambda: AlbertConfig(**TINY, embedding_size=16),
    "modernbert": lambda: ModernBertConfig(**{**TINY, "num_hidden_layers": 3}, local_attention=4,
                                           global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=1,
                                           eos_token_id=2, cls_token_id=1, sep_token_id=2),
}


def test_the_4d_mask_list_is_the_model_types_checked_here():
    """The list and the test below cannot drift apart: each listed type is checked, and each type
    checked is listed or is ModernBERT, which must not be."""
    assert set(FOUR_D_MASK_MODEL_TYPES) == set(TINY_CONFIGS) - {"modernbert"}


@pytest.mark.parametrize("model_type", list(TINY_CONFIGS))
def test_the_mask_masked_lm_gives_an_sdpa_model_changes_none_of_its_outputs(model_type):
    """On a padded batch, the logits with the mask `MaskedLM` gives equal those with the plain 2-D mask:
    the 4-D boolean mask for the listed types; ModernBERT, where the 4-D mask would differ (it skips the
    sliding window built from the 2-D mask, issue 75), gets the 2-D mask. Without padding, no mask
    (`attends_all`) equals the 2-D all-ones mask for every type."""
    config = TINY_CONFIGS[model_type]()
    assert config.model_type == model_type
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(config, attn_implementation="sdpa").eval()
    assert model.config._attn_implementation == "sdpa"
    objective = MaskedLM(model)
    attention_mask = torch.ones(3, 16, dtype=torch.long)
    attention_mask[1, 11:] = 0
    attention_mask[2, 6:] = 0  # every row longer than ModernBERT's 4-token window
    input_ids = torch.randint(5, 64, (3, 16)).masked_fill(attention_mask == 0, config.pad_token_id)
    real = attention_mask.bool()
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=attention_mask).logits[real]
        given = objective.model_attention_mask(attention_mask, attends_all=False)
        if model_type in FOUR_D_MASK_MODEL_TYPES:
            assert given.shape == (3, 1, 16, 16) and given.dtype == torch.bool
            torch.testing.assert_close(model(input_ids=input_ids, attention_mask=given).logits[real], expected,
                                       rtol=0, atol=1e-6)
        else:
            assert model_type == "modernbert" and "sliding_attention" in config.layer_types
            assert given is attention_mask
            four_d = attention_mask.bool()[:, None, None, :].expand(-1, 1, 16, -1)
            differs = (model(input_ids=input_ids, attention_mask=four_d).logits[real] - expected).abs().max()
            assert differs > 1e-4  # what the 4-D mask gave it before issue 75
        unpadded = torch.ones_like(attention_mask)
        assert objective.model_attention_mask(unpadded, attends_all=True) is None
        torch.testing.assert_close(model(input_ids=input_ids, attention_mask=None).logits,
                                   model(input_ids=input_ids, attention_mask=unpadded).logits, rtol=0, atol=1e-6)

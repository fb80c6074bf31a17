"""A short CPU run of the ExLM objective with the offline MiniLM on the shipped Debian sample."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoTokenizer, BertForMaskedLM

from maskstream.trainer.exlm import ExLMForMaskedLM, evaluation_counts, expand_batch


def _batches(tokenizer, path, *, count: int, batch_size: int, max_length: int, seed: int):
    """Tokenized descriptions with a seeded random 15% selection of non-special tokens."""
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(count * batch_size), f, strict=False)]
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[start : start + batch_size],
            truncation=True,
            max_length=max_length,
            padding=True,
            return_special_tokens_mask=True,
            return_tensors="pt",
        )
        selectable = enc["attention_mask"].bool() & ~enc["special_tokens_mask"].bool()
        chosen = selectable & (torch.rand(selectable.shape, generator=gen) < 0.15)
        batches.append((enc["input_ids"], enc["attention_mask"], chosen))
    return batches


@pytest.mark.slow
def test_exlm_training_lowers_held_out_loss_on_real_text(minilm_path, sample_corpus):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    # all-MiniLM-L6-v2 ships no MLM head: BertForMaskedLM creates one, its decoder tied to the input embeddings.
    mlm = BertForMaskedLM.from_pretrained(minilm_path)
    assert mlm.get_output_embeddings().weight is mlm.get_input_embeddings().weight
    model = ExLMForMaskedLM(mlm, num_states=4)
    batches = _batches(tokenizer, sample_corpus, count=4, batch_size=8, max_length=32, seed=0)
    train, held_out = batches[:3], batches[3]

    def expanded(batch):
        ids, attention, chosen = batch
        return expand_batch(ids, attention, chosen, num_states=4, mask_token_id=tokenizer.mask_token_id)

    def evaluate():
        model.eval()
        with torch.no_grad():
            x = expanded(held_out)
            out = model.forward_expanded(x)
            counts = evaluation_counts(out, x)
        model.train()
        return float(out.loss), counts

    loss_before, counts_before = evaluate()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    losses = []
    for _ in range(2):
        for batch in train:
            out = model.forward_expanded(expanded(batch))
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            losses.append(float(out.loss.detach()))
    loss_after, counts_after = evaluate()

    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    assert loss_after < 0.8 * loss_before, (loss_before, loss_after)
    perplexity_before = math.exp(counts_before["nll"] / counts_before["masked"])
    perplexity_after = math.exp(counts_after["nll"] / counts_after["masked"])
    assert perplexity_after < 0.5 * perplexity_before
    assert int(counts_after["masked"]) == int(held_out[2].sum()) > 0

"""The general-English masked LM shipped in the package (`maskstream/english_mlm/`, issue 74), loaded offline as
`train` and `evaluate` load it: what it is, and the fill-mask sentences fixed before its training
(benchmarks/english_mlm/fill_mask.json), answered by Hugging Face's fill-mask pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maskstream.models import default_mlm, default_model
from maskstream.schemas.manifest import sha256_file, vocab_hash

MODEL = Path(default_mlm())
RECORD = json.loads((MODEL / "general.json").read_text(encoding="utf-8"))


def test_the_model_is_what_its_card_and_record_say() -> None:
    """fp16 weights of at most 50 MB with the sha256 the record gives; MiniLM's vocabulary; enough positions."""
    weights = MODEL / "model.safetensors"
    assert weights.stat().st_size <= 50_000_000
    assert sha256_file(str(weights)) == RECORD["weights_sha256"]
    config = json.loads((MODEL / "config.json").read_text(encoding="utf-8"))
    assert config["max_position_embeddings"] >= RECORD["max_length"]
    card = (MODEL / "README.md").read_text(encoding="utf-8")
    assert RECORD["weights_sha256"] in card
    assert f"{RECORD['held_out_curve'][-1]['accuracy']:.3f}" in card


def test_it_reads_the_vocabulary_build_tokenizes_with() -> None:
    """A dataset built at the defaults (MiniLM's tokenizer) trains this model: same vocabulary, same ids."""
    from transformers import AutoTokenizer

    shipped, minilm = AutoTokenizer.from_pretrained(str(MODEL)), AutoTokenizer.from_pretrained(default_model())
    assert vocab_hash(shipped.get_vocab()) == vocab_hash(minilm.get_vocab())
    text = "The capital of France is Paris; debcargo builds Rust crates."
    assert shipped(text)["input_ids"] == minilm(text)["input_ids"]


@pytest.mark.slow
def test_it_loads_as_float32_with_a_trained_head_and_answers_the_fixed_sentences() -> None:
    """Loaded as `train` loads it (float32, no new weights), and the fill-mask mark fixed before training:
    at least `min_passing` of the sentences it never read have an accepted answer among its top-k guesses."""
    import torch
    from transformers import AutoModelForMaskedLM

    from benchmarks.english_mlm.card import card, fill_mask
    from maskstream.models import load_pretrained

    model, loading = load_pretrained(AutoModelForMaskedLM, str(MODEL), "MLM head", "unexpected for this model")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert not loading["missing_keys"] and not loading["mismatched_keys"]  # the head is the trained one
    filled = fill_mask(MODEL)
    # the committed card, its guesses included, is what this machine computes offline
    assert card(RECORD, filled) == (MODEL / "README.md").read_text(encoding="utf-8")
    assert filled["passes"], json.dumps(filled["sentences"], indent=1)

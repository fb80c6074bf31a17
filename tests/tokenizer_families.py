"""Tokenizers of the main families, trained with the `tokenizers` library on the shipped corpus
(small vocabularies: seconds each, nothing downloaded), wrapped as Hugging Face fast tokenizers
with each family's own special tokens and post-processor, and saved to a folder so that the
pipeline loads them as it loads any `--model` path.

- `wordpiece`: BERT (lower-cased, accents stripped), `[CLS] $A [SEP]`.
- `bytelevel`: RoBERTa byte-level BPE, `add_prefix_space=True`, trimmed offsets, `<s> $A </s>`.
- `bytelevel-noprefix`: GPT-2-style byte-level BPE, `add_prefix_space=False`, untrimmed offsets
  (offsets include the leading space), RoBERTa's specials.
- `unigram`: XLM-R-style SentencePiece Unigram, Metaspace (`prepend_scheme="always"`), `<s> $A </s>`.
- `unigram-t5`: T5-style Unigram, Metaspace, no BOS: `$A </s>`.
- `sentencepiece-bpe`: Llama-style SentencePiece BPE, Metaspace (`prepend_scheme="first"`), BOS
  only: `<s> $A` (no end token).

Like SentencePiece's own trainer (`split_by_unicode_script`, `split_by_number`), the Metaspace
tokenizers are trained on pieces split at letter/digit/punctuation boundaries, then encode with
the Metaspace pre-tokenizer alone, as the released XLM-R / T5 / Llama tokenizers do.
"""

from __future__ import annotations

import json
from pathlib import Path

FAMILIES = ("wordpiece", "bytelevel", "bytelevel-noprefix", "unigram", "unigram-t5", "sentencepiece-bpe")
VOCAB_SIZE = 3000


def corpus_texts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _sentencepiece_training_split():
    """Pieces split as SentencePiece's trainer splits them (script and number boundaries)."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
        pre_tokenizers.Split(Regex(r"▁?\p{L}+|\p{N}+|▁?[^\p{L}\p{N}▁]+|▁"), behavior="isolated"),
    ])


def train_family(family: str, texts: list[str], folder: Path, mask: bool = True) -> str:
    """Trains `family` on `texts`, saves it under `folder` (a `--model` path) and returns the path.
    `mask=False` leaves the mask token out (a T5-like tokenizer the build must refuse)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if family == "wordpiece":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials)
        names = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                 "mask_token": "[MASK]"}
    elif family.startswith("bytelevel"):
        prefix = family == "bytelevel"
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix, trim_offsets=prefix)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        names = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
                 "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>"}
    elif family in ("unigram", "unigram-t5", "sentencepiece-bpe"):
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        if family == "sentencepiece-bpe":
            tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
            trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials)
        else:
            tokenizer = Tokenizer(models.Unigram())
            trainer = trainers.UnigramTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, unk_token="<unk>")
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = _sentencepiece_training_split()
        scheme = "first" if family == "sentencepiece-bpe" else "always"
        tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
        names = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
                 "mask_token": "<mask>"}
        if family == "unigram":
            names.update(cls_token="<s>", sep_token="</s>")
    else:
        raise ValueError(f"unknown family {family!r}")
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if family in ("unigram", "unigram-t5", "sentencepiece-bpe"):  # encode as the released tokenizers do
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
    ids = {token: tokenizer.token_to_id(token) for token in specials}
    if family == "wordpiece":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    elif family.startswith("bytelevel"):
        tokenizer.post_processor = processors.RobertaProcessing(
            ("</s>", ids["</s>"]), ("<s>", ids["<s>"]), add_prefix_space=prefix, trim_offsets=prefix)
    elif family == "unigram":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])])
    elif family == "unigram-t5":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", ids["</s>"])])
    else:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", ids["<s>"])])
    if not mask:
        names.pop("mask_token")
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=512, **names)
    path = folder / family
    wrapped.save_pretrained(str(path))
    return str(path)

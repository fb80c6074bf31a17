"""Every tokenizer family maps tokens to the right words, on every word occurrence of the shipped
corpus: WordPiece, byte-level BPE (with and without add_prefix_space), SentencePiece Unigram and
BPE with Metaspace, each trained here on the corpus (testing/tokenizer_families.py).

Checked against the tokenizers' own decoders: the tokens the build assigns to a word decode to
that word (as the tokenizer normalizes it). Then, on the build's real sequences: windows never
split a word, and whole-word masking masks all of a word's tokens or none.
"""

from __future__ import annotations

import numpy as np
import pytest

from maskstream.mask_signal.words import word_spans
from maskstream.pipelines.corpus import Document
from maskstream.pipelines.dataset.core.sequences import cut_windows, flat, pack_documents, tokenize_documents
from maskstream.pipelines.dataset.core.tokenizer_facts import (
    check_tokenizer,
    load_backend_tokenizer,
    load_tokenizer,
    pack_separator,
    special_template,
)
from maskstream.pipelines.dataset.inspect.check_tokenizer import word_decode_report
from maskstream.pipelines.dataset.steps import vocabulary_index
from testing.tokenizer_families import FAMILIES, corpus_texts, train_family

# What each family puts around a sequence (prefix, suffix), as tokens.
TEMPLATES = {
    "wordpiece": (["[CLS]"], ["[SEP]"]),
    "bytelevel": (["<s>"], ["</s>"]),
    "bytelevel-noprefix": (["<s>"], ["</s>"]),
    "unigram": (["<s>"], ["</s>"]),
    "unigram-t5": ([], ["</s>"]),
    "sentencepiece-bpe": (["<s>"], []),
}
WINDOW = 24  # short windows: many cuts, each a chance to split a word


@pytest.fixture(scope="module")
def texts(sample_corpus) -> list[str]:
    return corpus_texts(sample_corpus)


@pytest.fixture(scope="module")
def family_path(tmp_path_factory, texts):
    """family -> a saved tokenizer folder, each trained once per module."""
    folder = tmp_path_factory.mktemp("families")
    paths: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in paths:
            paths[family] = train_family(family, texts, folder)
        return paths[family]

    return get


@pytest.fixture(scope="module")
def documents(texts) -> list[Document]:
    return [Document(f"sample:line {i + 1}", "sample", t) for i, t in enumerate(texts)]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_word_occurrence_gets_exactly_its_own_tokens(family, family_path, texts):
    report = word_decode_report(family_path(family), texts, examples=10)
    print(f"\n{family}: {report['words']} word occurrences, {report['right']} right, {report['joined']} right in "
          f"joined units, {report['wrong']} wrong, {report['tokens_across_words']} tokens across words")
    assert report["words"] > 150_000
    assert report["wrong"] == 0, report["wrong_examples"]
    assert report["right"] + report["joined"] == report["words"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_build_gives_each_token_its_words_row(family, family_path, documents):
    """tokenize_documents (the build's and update's path): each token's word-table row is the
    normalized word its characters overlap, for a vocabulary missing some words."""
    backend = load_backend_tokenizer(family_path(family))
    batch = documents[:300]
    spelled = sorted({w for d in batch for _, _, w in word_spans(d.text)})
    vocabulary = {w: i for i, w in enumerate(w for i, w in enumerate(spelled) if i % 7)}  # rows: sorted order
    table, empty, _ = tokenize_documents(backend, batch, vocabulary_index(list(vocabulary)))
    assert not empty and table.num_rows == len(batch)
    for document, row in zip(batch, table.to_pylist(), strict=True):
        encoding = backend.encode(document.text, add_special_tokens=False)
        spans = word_spans(document.text)
        expected = []
        for start, end in encoding.offsets:
            overlapped = [(min(end, e) - max(start, s), w) for s, e, w in spans if s < end and start < e]
            expected.append(vocabulary.get(max(overlapped, key=lambda x: x[0])[1], -1) if overlapped else -1)
        assert row["word_index"] == expected
        assert row["input_ids"] == encoding.ids


def _windows(family_path, family, documents, packing):
    name = family_path(family)
    backend = load_backend_tokenizer(name)
    table, _, _ = tokenize_documents(backend, documents, vocabulary_index([]))
    prefix, suffix = special_template(backend)
    if packing == "pack":
        windows = pack_documents("all", table, pack_separator(name), prefix, suffix, WINDOW)
    else:
        windows = cut_windows(table, prefix, suffix, WINDOW)
    return table, windows, prefix, suffix


@pytest.mark.parametrize("family", FAMILIES)
def test_specials_and_windows_never_split_a_word(family, family_path, documents):
    """Per family: the template's specials around every window; truncate windows never end inside
    a word (unless the word alone fills a window); packed documents are separated."""
    hf = load_tokenizer(family_path(family))
    batch = documents[:400]
    table, windows, prefix, suffix = _windows(family_path, family, batch, "truncate")
    assert (hf.convert_ids_to_tokens(prefix), hf.convert_ids_to_tokens(suffix)) == TEMPLATES[family]
    capacity = WINDOW - len(prefix) - len(suffix)
    occurrence, offsets = flat(table, "word_ids")
    by_unit: dict[str, list[int]] = {}
    for row in windows.to_pylist():
        ids = row["input_ids"]
        assert ids[: len(prefix)] == prefix and ids[len(ids) - len(suffix):] == suffix
        by_unit.setdefault(row["unit"], []).append(len(ids) - len(prefix) - len(suffix))
    cuts = splits = 0
    for i, document in enumerate(table.column("document_id").to_pylist()):
        occ = occurrence[offsets[i] : offsets[i + 1]]
        assert sum(by_unit[document]) == len(occ)  # every token kept
        lengths = np.bincount(occ)
        for cut in np.cumsum(by_unit[document])[:-1]:
            cuts += 1
            if occ[cut] == occ[cut - 1]:
                splits += 1
                assert lengths[occ[cut]] > capacity, f"{document}: a window splits a word at token {cut}"
    print(f"\n{family}: {len(windows)} windows, {cuts} cuts, {splits} inside words longer than a window")
    assert cuts > 1000

    _, packed, _, _ = _windows(family_path, family, batch[:50], "pack")
    separator = pack_separator(family_path(family))
    assert len(separator) == 1 and hf.convert_ids_to_tokens(separator)[0] in ("[SEP]", "</s>")
    body_tokens = sum(len(r["input_ids"]) for r in packed.to_pylist())
    assert body_tokens >= len(flat(table.slice(0, 50), "input_ids")[0])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("strategy", ["whole_word", "span"])
def test_whole_word_masking_masks_all_of_a_words_tokens_or_none(family, strategy, family_path, documents):
    from maskstream.trainer.collate import collate_sequences
    from maskstream.trainer.masking import MaskingConfig, apply_masking

    _, windows, _, _ = _windows(family_path, family, documents[:300], "truncate")
    windows = windows.slice(0, 512)
    samples = [{"input_ids": np.array(r["input_ids"]), "word_ids": np.array(r["word_ids"]),
                "special_tokens_mask": np.array(r["special_tokens_mask"]),
                "mask_probability": np.zeros(len(r["input_ids"]), np.float32), "sample_index": i}
               for i, r in enumerate(windows.to_pylist())]
    batch = collate_sequences(samples, pad_token_id=load_tokenizer(family_path(family)).pad_token_id)
    config = MaskingConfig.from_tokenizer(load_tokenizer(family_path(family)), budget=0.3)
    masked = apply_masking(batch, strategy, config, seed=7, epoch=0)["labels"].numpy() != -100
    word_ids = batch["word_ids"].numpy()
    multi_token = partial = chosen = 0
    for row in range(len(samples)):
        for word in np.unique(word_ids[row][word_ids[row] >= 0]):
            tokens = masked[row][word_ids[row] == word]
            multi_token += len(tokens) > 1
            chosen += tokens.all()
            partial += tokens.any() and not tokens.all()
    print(f"\n{family} {strategy}: {chosen} words masked, {multi_token} multi-token words, {partial} partly masked")
    assert partial == 0 and chosen > 1000 and multi_token > 1000


def test_bad_tokenizers_are_refused_with_what_is_missing(family_path, texts, tmp_path, minilm_path):
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from transformers import AutoTokenizer, ByT5Tokenizer, PreTrainedTokenizerFast

    no_mask = train_family("unigram-t5", texts[:300], tmp_path, mask=False)
    with pytest.raises(ValueError, match="no mask token"):
        check_tokenizer(no_mask)

    slow = tmp_path / "slow"
    ByT5Tokenizer().save_pretrained(str(slow))
    assert not AutoTokenizer.from_pretrained(str(slow)).is_fast
    with pytest.raises(ValueError, match="no fast tokenizer.*no mask token"):
        check_tokenizer(str(slow))

    # A fast tokenizer whose offsets reach no word: its pre-tokenizer drops every letter.
    backend = Tokenizer.from_str(AutoTokenizer.from_pretrained(minilm_path).backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="removed")
    PreTrainedTokenizerFast(tokenizer_object=backend, mask_token="[MASK]", unk_token="[UNK]",
                            cls_token="[CLS]", sep_token="[SEP]").save_pretrained(str(tmp_path / "no-offsets"))
    with pytest.raises(ValueError, match="no usable character offsets"):
        check_tokenizer(str(tmp_path / "no-offsets"))

    check_tokenizer(family_path("sentencepiece-bpe"), "pack")  # no end token in its template: eos separates


@pytest.mark.slow
def test_build_refuses_a_tokenizer_without_mask_token_at_start(texts, tmp_path, subprocess_env):
    from tests.conftest import run_cli

    no_mask = train_family("unigram-t5", texts[:300], tmp_path, mask=False)
    result = run_cli(["build", "--input", "missing.jsonl", "--stats", str(tmp_path), "--seeds", str(tmp_path / "s"),
                      "--output", str(tmp_path / "out"), "--model", no_mask], subprocess_env, check=False)
    assert result.returncode == 2 and "no mask token" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["unigram", "bytelevel-noprefix"])
def test_fine_tuning_word_ids_follow_the_build(family, family_path, documents):
    """The fine-tuning tokenization numbers words as the build does (not HF word_ids())."""
    from maskstream.trainer.finetune import LabeledSet, encode

    batch = documents[:100]
    hf = load_tokenizer(family_path(family))
    data = LabeledSet(source="sample", texts=[d.text for d in batch], labels=["x"] * len(batch))
    samples = encode(hf, data, {"x": 0}, max_length=100_000)
    table, _, _ = tokenize_documents(load_backend_tokenizer(family_path(family)), batch, vocabulary_index([]))
    for sample, row in zip(samples, table.to_pylist(), strict=True):
        body = sample["special_tokens_mask"] == 0
        assert sample["input_ids"][body].tolist() == row["input_ids"]
        assert sample["word_ids"][body].tolist() == row["word_ids"]
        assert np.all(sample["word_ids"][~body] == -1)


@pytest.mark.slow
def test_check_tokenizer_command(family_path, minilm_path, subprocess_env, tmp_path, texts):
    from tests.conftest import run_cli

    result = run_cli(["check-tokenizer", family_path("unigram"), "--documents", "300"], subprocess_env)
    assert "decode to their word" in result.stdout and "(100.000%)" in result.stdout and "wrong                0" in result.stdout
    no_mask = train_family("unigram-t5", texts[:300], tmp_path, mask=False)
    refused = run_cli(["check-tokenizer", no_mask], subprocess_env, check=False)
    assert refused.returncode == 2 and "no mask token" in refused.stderr


def test_a_token_across_two_words_goes_to_the_larger_part_and_joins_them():
    from maskstream.mask_signal.alignment import align_tokens_to_words
    from maskstream.mask_signal.words import word_boundaries

    text = "e.g. foo-bar xy"
    # Tokens: "e.g" (across e and g), ".", "▁foo-b" (across foo and bar, mostly foo), "ar", "▁", "xy".
    tokens = np.array([(0, 3), (3, 4), (4, 10), (10, 12), (12, 13), (13, 15)])
    starts, ends = word_boundaries(text)
    occurrence, span, across = align_tokens_to_words(tokens[:, 0], tokens[:, 1], starts, ends)
    assert [text[s:e] for s, e in zip(starts, ends, strict=True)] == ["e", "g", "foo", "bar", "xy"]
    assert across == 2
    assert span.tolist() == [0, -1, 2, 3, -1, 4]  # e (a tie: the first), none, foo (3 of 4 letters), bar, none, xy
    assert occurrence.tolist() == [0, 1, 2, 2, 3, 4]  # foo and bar are one occurrence: masked and windowed together


def test_a_tokenizer_trained_across_word_boundaries_is_still_right(texts, tmp_path):
    """A Unigram trained on whitespace pieces alone (no script split) learns pieces across words
    (`e.g`, `86_64`): they are counted, their words joined, and still no occurrence is wrong."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(texts[:800], trainers.UnigramTrainer(
        vocab_size=2000, special_tokens=["<pad>", "</s>", "<unk>", "<mask>"], unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, mask_token="<mask>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(str(tmp_path / "across"))
    report = word_decode_report(str(tmp_path / "across"), texts[:800])
    print(f"\nwhitespace-trained unigram: {report['words']} words, {report['joined']} in joined units, "
          f"{report['tokens_across_words']} tokens across words, {report['wrong']} wrong")
    assert report["tokens_across_words"] > 0 and report["joined"] > 0
    assert report["wrong"] == 0, report["wrong_examples"]

"""The default masked LM's corpus readers (benchmarks/english_mlm/corpus.py) on entries as the pinned
archives hold them: GCIDE's dictd entries, WordNet's data lines, dictd's base64 index numbers; and the model
card written from what pretraining records (benchmarks/english_mlm/card.py)."""

from __future__ import annotations

import base64

from benchmarks.english_mlm.corpus import b64_number, gcide_text, paragraphs, word_count, wordnet_documents

ENTRY = '''Affatuate \\Af*fat"u*ate\\, v. t. [L. ad + fatuus foolish.]
   To infatuate. [Obs.] --Milton.
   [1913 Webster]

Affear \\Af*fear"\\, v. t. [OE. aferen, AS. [=a]f?ran. See
   {Afeard}.]
   To frighten. [Obs.] --Spenser.
   [1913 Webster]
'''


def test_a_gcide_entry_keeps_its_prose_and_loses_the_markup() -> None:
    assert gcide_text(ENTRY) == "Affatuate, v. t. To infatuate. Affear, v. t. To frighten."


def test_dictd_index_numbers_are_base64_digits() -> None:
    # dictd writes offsets as base64 digits, most significant first: the bytes of a big-endian number
    for value in (0, 63, 64, 675, 4978, 5_399_735, 2**30 + 7):
        digits = base64.b64encode(value.to_bytes(6, "big")).decode().lstrip("A") or "A"
        assert b64_number(digits) == value


def test_a_wordnet_line_is_its_words_then_its_gloss() -> None:
    line = ('00001930 03 n 01 physical_entity 0 007 @ 00001740 n 0000 ~ 00002452 n 0000 | an entity that has '
            'physical existence  \n')
    header = "  1 This software and database is being provided to you, the LICENSEE\n"
    members = {f"./usr/share/wordnet/data.{part}": b"" for part in ("noun", "verb", "adj", "adv")}
    members["./usr/share/wordnet/data.noun"] = (header + line).encode()
    members["./usr/share/wordnet/data.adj"] = (b'00001740 00 a 02 able(p) 0 capable 0 000 | (usually followed by `to\') '
                                               b'having the necessary means; "able to swim"\n')
    assert list(wordnet_documents(members)) == [
        "physical entity: an entity that has physical existence",
        'able, capable: (usually followed by `to\') having the necessary means; "able to swim"']


def test_words_and_paragraphs() -> None:
    assert word_count("Jacob's tent , 3 men -- and don’t.") == 6
    verse = "\n\n".join(["line one of a verse"] * 30)
    chunks = list(paragraphs(verse, words=40))
    assert [len(c.split()) for c in chunks] == [40] * 3 + [30] and " ".join(chunks) == " ".join(verse.split())


def test_the_model_card_says_what_it_read_for_how_long_and_what_it_reaches(tiny_bert, tmp_path) -> None:
    """The card written from a model's record and the fixed fill-mask sentences, here on a tiny untrained
    BERT: every pinned source with its counts, the tokens read, the held-out result and each sentence's row,
    with the mark applied as fill_mask.json fixes it."""
    import json

    from benchmarks.english_mlm.card import FILL_MASK, card, fill_mask
    from benchmarks.english_mlm.corpus import SOURCES

    filled = fill_mask(tiny_bert)
    spec = json.loads(FILL_MASK.read_text(encoding="utf-8"))
    assert len(filled["sentences"]) == len(spec["sentences"]) and filled["top_k"] == spec["top_k"] == 10
    assert all(len(row["guesses"]) == 10 for row in filled["sentences"])
    assert filled["passes"] == (filled["passing"] >= spec["min_passing"])
    record = {"shape": {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                        "intermediate_size": 1024},
              "settings": {"steps": 10_000, "batch_size": 64, "learning_rate": 5e-4, "warmup_steps": 500},
              "corpus": {"documents": 259_923, "texts_sha256": "ab" * 32,
                         "sources": {s.package: {"documents": 10 + i, "words": 1000 * i} for i, s in enumerate(SOURCES)}},
              "held_out_curve": [{"step": s, "accuracy": s / 100_000} for s in range(0, 10_001, 500)],
              "held_out": {"accuracy": 0.41, "loss": 3.2, "masked_tokens": 9596}, "max_length": 128,
              "parameters": 11_103_290, "weights_bytes": 22_206_580, "weights_sha256": "cd" * 32,
              "rows": {"train": 99_000, "held_out": 500}, "passes": 6.46, "seconds": 15_000.0, "threads": 2,
              "hardware": {"cpu": "Some CPU @ 2.10GHz", "cpu_count": 2, "torch_threads": 2, "gpu": None}}
    text = card(record, filled)
    for i, source in enumerate(SOURCES):
        assert f"(`{source.package}`) | {source.version} | {source.license} | {10 + i:,} | {1000 * i:,} |" in text
    assert "10,000 steps: 81,920,000 tokens, 6.5 passes" in text and "8.3 CPU-hours; Some CPU @ 2.10GHz, 2 cores)" in text
    assert "{'" not in text  # no Python dict printed as it is
    assert "**0.410**" in text and "0.000 (0) → 0.020 (2,000)" in text and "0.100 (10,000)" in text
    assert f"**{filled['passing']} of 12**" in text
    assert sum(line.startswith("| ") and line.endswith((" yes |", " no |")) for line in text.splitlines()) == 12

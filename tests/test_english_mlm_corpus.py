"""The default masked LM's corpus readers (benchmarks/english_mlm/corpus.py) on entries as the pinned
archives hold them: GCIDE's dictd entries, WordNet's data lines, dictd's base64 index numbers."""

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

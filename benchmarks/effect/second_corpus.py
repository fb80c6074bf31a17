"""The second labeled task of issue 60: docstrings of Python's standard library, labeled by package.

`maskstream evaluate`'s defaults are chosen on the shipped Debian descriptions; they are checked once,
without tuning again, on a task unlike both that text and the `small` model's pretraining text (every
other Debian description). API documentation is another register of technical English: it explains
arguments, return values and errors where a package description sells what a program does.

The task, fixed before any result on it:
- every module, class and function docstring (`ast.get_docstring`, so the source is parsed, never
  imported) of the CPython 3.11.7 standard library's packages (folders; single-file modules have
  no package to name), whitespace collapsed to single spaces, ten words or more;
- the label is the package (`email`, `asyncio`, ...): the ten packages with the most such docstrings,
  the test suite (`test`) left out, since its docstrings describe the tests of every other package;
- a text found twice in one package is kept once; a text found in two packages is dropped (no label);
- one JSON object a line, `{"text", "package", "source"}` (`source`: file and line), in the order of
  package, file and line.

    python -m benchmarks.effect.second_corpus benchmarks/effect/corpus/python-stdlib-docstrings.jsonl

`configs.SECOND_TASK` pins the file's sha256; the file is committed, so another Python gives the
same task. Source and licence: the Python Software Foundation License (the CPython sources).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import sysconfig
from collections import Counter
from pathlib import Path

PYTHON = "3.11.7"
PACKAGES = 10
MIN_WORDS = 10
LEFT_OUT = ("test", "site-packages")


def docstrings(stdlib: Path) -> list[dict[str, str]]:
    """Every docstring of ten words or more in the standard library's packages, with its package and place."""
    found = []
    for path in sorted(stdlib.rglob("*.py")):
        relative = path.relative_to(stdlib)
        if len(relative.parts) < 2 or relative.parts[0] in LEFT_OUT:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):  # lib2to3's test data holds Python 2 on purpose
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                text = " ".join((ast.get_docstring(node) or "").split())
                if len(text.split()) >= MIN_WORDS:
                    found.append({"text": text, "package": relative.parts[0],
                                  "source": f"{relative.as_posix()}:{getattr(node, 'lineno', 1)}"})
    return found


def task(found: list[dict[str, str]]) -> list[dict[str, str]]:
    """The ten largest packages' docstrings, each text once, none in two packages."""
    packages_of: dict[str, set[str]] = {}
    for row in found:
        packages_of.setdefault(row["text"], set()).add(row["package"])
    labeled = [r for r in found if len(packages_of[r["text"]]) == 1]
    seen: set[str] = set()
    unique = [r for r in labeled if not (r["text"] in seen or seen.add(r["text"]))]
    sizes = Counter(r["package"] for r in unique)
    chosen = {p for p, _ in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:PACKAGES]}
    return sorted((r for r in unique if r["package"] in chosen), key=lambda r: (r["package"], r["source"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path)
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]),
                        help="the standard library's folder (default: this Python's)")
    args = parser.parse_args(argv)
    version = ".".join(map(str, sys.version_info[:3]))
    if args.stdlib == Path(sysconfig.get_paths()["stdlib"]) and version != PYTHON:
        raise SystemExit(f"the task is CPython {PYTHON}'s standard library; this is {version}: pass --stdlib")
    rows = task(docstrings(args.stdlib))
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(data)
    counts = Counter(r["package"] for r in rows)
    print(f"wrote {args.output}: {len(rows)} docstrings, {len(counts)} packages {dict(counts.most_common())}, "
          f"sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

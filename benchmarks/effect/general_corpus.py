"""The general corpus the `small` config's model is pretrained on, made once and shipped compressed.

Every distinct English description of the Debian 12 archive (`benchmarks/debian_corpus.py`), minus
the task's sections (science, math, electronics: the labels of the shipped task), minus near-duplicates
within it (one text kept per near-duplicate cluster, `neardup.clusters`: library, -dev and -doc
packages often share a description but for a word). `prepare` then removes the near-duplicates of
the task's validation and test texts, which depend on the split.

    python -m benchmarks.effect.general_corpus benchmarks/effect/corpus/debian-general.jsonl.gz

The file is written as gzip with no name or time in its header (`mtime=0`), so the same
descriptions give the same bytes; `configs.GENERAL_CORPUS` pins its sha256.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

from benchmarks.debian_corpus import debian_documents
from benchmarks.effect import neardup

TASK_SECTIONS = ("science", "math", "electronics")


def general_documents(exclude_sections: tuple[str, ...] = TASK_SECTIONS) -> tuple[list[dict[str, str]], dict]:
    """(documents, counts): the descriptions outside `exclude_sections`, one per near-duplicate cluster
    (the first in apt-list order)."""
    documents = [d for d in debian_documents() if d["section"] not in exclude_sections]
    cluster_of = neardup.clusters([d["text"] for d in documents])
    seen: set[int] = set()
    kept = []
    for document, cluster in zip(documents, cluster_of, strict=True):
        if cluster not in seen:
            seen.add(cluster)
            kept.append(document)
    return kept, {"outside_task_sections": len(documents), "kept": len(kept),
                  "near_duplicates_dropped": len(documents) - len(kept)}


def write_gzip_jsonl(path: Path, documents: list[dict[str, str]]) -> str:
    """Writes reproducible gzip JSONL (no name, mtime 0); returns the file's sha256."""
    data = "".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in documents).encode("utf-8")
    compressed = gzip.compress(data, compresslevel=9, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(compressed)
    return hashlib.sha256(compressed).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output .jsonl.gz")
    parser.add_argument("--exclude-sections", nargs="*", default=list(TASK_SECTIONS),
                        help=f"sections left out (default: {' '.join(TASK_SECTIONS)})")
    args = parser.parse_args(argv)
    documents, counts = general_documents(tuple(args.exclude_sections))
    sha = write_gzip_jsonl(args.out, documents)
    print(json.dumps({**counts, "characters": sum(len(d["text"]) for d in documents), "sha256": sha}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

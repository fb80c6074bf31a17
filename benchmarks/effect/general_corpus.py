"""The general corpus the `small` config's model is pretrained on, made once and shipped compressed.

Every distinct English description of the Debian 12 archive (`benchmarks/debian_corpus.py`), minus
the task's sections (science, math, electronics: the labels of the shipped task), minus near-duplicates
within it (one text kept per near-duplicate cluster, `neardup.clusters`: library, -dev and -doc
packages often share a description but for a word), minus every near-duplicate of a text of the task
(`data/debian-science.jsonl`): `maskstream evaluate` judges every labeled text, so the general model
must not have read one (it refuses a general corpus that holds one).

    python -m benchmarks.effect.general_corpus benchmarks/effect/corpus/debian-general.jsonl.gz

`--from FILE` takes the descriptions of an earlier general corpus instead of the apt lists (the
filters commute; which member of a near-duplicate cluster is kept may differ where the earlier file's
clusters came from a MinHash LSH that missed pairs).

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
from maskstream.evaluate import neardup

TASK_SECTIONS = ("science", "math", "electronics")
TASK = Path(__file__).resolve().parents[2] / "data" / "debian-science.jsonl"


def general_documents(documents: list[dict[str, str]], task_texts: list[str],
                      exclude_sections: tuple[str, ...] = TASK_SECTIONS) -> tuple[list[dict[str, str]], dict]:
    """(documents, counts): the descriptions outside `exclude_sections`, one per near-duplicate cluster
    (the first in apt-list order), none a near-duplicate of a task text."""
    outside = [d for d in documents if d["section"] not in exclude_sections]
    cluster_of = neardup.clusters([d["text"] for d in outside])
    seen: set[int] = set()
    distinct = []
    for document, cluster in zip(outside, cluster_of, strict=True):
        if cluster not in seen:
            seen.add(cluster)
            distinct.append(document)
    leaking = set(neardup.with_near_duplicate([d["text"] for d in distinct], task_texts))
    kept = [d for i, d in enumerate(distinct) if i not in leaking]
    return kept, {"outside_task_sections": len(outside), "near_duplicates_dropped": len(outside) - len(distinct),
                  "task_near_duplicates_dropped": len(leaking), "kept": len(kept)}


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
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="an earlier general corpus (.jsonl.gz) to take the descriptions from (default: apt lists)")
    args = parser.parse_args(argv)
    if args.source is None:
        source = debian_documents()
    else:
        with gzip.open(args.source, "rt", encoding="utf-8") as f:
            source = [json.loads(line) for line in f]
    task_texts = [json.loads(line)["text"] for line in TASK.read_text(encoding="utf-8").splitlines() if line.strip()]
    documents, counts = general_documents(source, task_texts, tuple(args.exclude_sections))
    sha = write_gzip_jsonl(args.out, documents)
    print(json.dumps({**counts, "characters": sum(len(d["text"]) for d in documents), "sha256": sha}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

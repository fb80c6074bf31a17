"""Reading the experiment's texts: a labeled file and unlabeled corpora (jsonl[.gz], parquet or txt).

Bad rows are not dropped silently: every reader returns (rows, rejects), and rejects say why.
"""

from __future__ import annotations

import glob
import gzip
import json
from pathlib import Path
from typing import Any


def expand(pattern: str) -> list[Path]:
    """The files a glob names (sorted); an error when it names none."""
    paths = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
    if not paths:
        raise SystemExit(f"{pattern!r} matches no file")
    return paths


def _records(path: Path, text_field: str) -> list[Any]:
    """A file's records: dicts for jsonl / parquet, strings (one per non-empty line) for txt."""
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            out = []
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as error:
                    out.append(ValueError(f"{path.name}:{number}: not JSON ({error.msg})"))
            return out
    if name.endswith(".parquet"):
        # heavy: this pyarrow module loads only when data is read: importing this module stays light
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if name.endswith(".txt"):
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    raise SystemExit(f"{path.name}: unknown format (use .jsonl, .jsonl.gz, .parquet or .txt)")


def read_texts(patterns: list[str], text_field: str = "text") -> tuple[list[dict[str, Any]], list[str]]:
    """Unlabeled rows ({"text", plus the record's other fields}) of every file the patterns name."""
    rows, rejects = [], []
    for path in (p for pattern in patterns for p in expand(pattern)):
        for record in _records(path, text_field):
            if isinstance(record, str):
                rows.append({"text": record})
            elif isinstance(record, Exception):
                rejects.append(str(record))
            elif not isinstance(record.get(text_field), str) or not record[text_field].strip():
                rejects.append(f"{path.name}: a record without a non-empty string {text_field!r}")
            else:
                rows.append({**record, "text": record[text_field]})
    return rows, rejects


def read_labeled(path: str, text_field: str = "text", label_field: str = "label"
                 ) -> tuple[list[dict[str, str]], list[str]]:
    """Labeled rows ({"text", "label"}) of one jsonl / parquet file."""
    rows, rejects = [], []
    for record in _records(Path(path), text_field):
        if isinstance(record, Exception):
            rejects.append(str(record))
        elif not isinstance(record, dict):
            raise SystemExit(f"{path}: labeled data must be jsonl or parquet with {text_field!r} and {label_field!r}")
        elif not isinstance(record.get(text_field), str) or not record[text_field].strip():
            rejects.append(f"a record without a non-empty string {text_field!r}")
        elif record.get(label_field) is None:
            rejects.append(f"a record without {label_field!r}")
        else:
            rows.append({"text": record[text_field], "label": str(record[label_field])})
    if len({r["label"] for r in rows}) < 2:
        raise SystemExit(f"{path}: needs at least two labels in {label_field!r}; found {sorted({r['label'] for r in rows})}")
    return rows, rejects

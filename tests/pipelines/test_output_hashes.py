"""Every output file of `stats`, `seeds`, `build` and `update` keeps its sha256 (issue 29 item 6).

Fixed inputs (a slice of the shipped corpus in two files, plus two malformed lines so that the
rejects are written too), a fixed `--version`, the tiny BERT fixture as the encoder and
`--encoder-dtype float32`, so that the bytes depend only on the code. A refactor must leave
these hashes as they are. A commit that changes an output format on purpose updates
`output_hashes.json` (run this file with MASKSTREAM_RECORD_HASHES=1) and says why in its message.

What is normalized before hashing, and why:
- `created_at` in manifest.json: the wall-clock time of the run.
- the part names of the embedding and word-frequency caches (`_cache/embeddings/KEY/part-TIME-RANDOM.parquet`,
  `_cache/general_frequency/...`): the time and a random suffix keep concurrent writers apart;
  the sorted hashes of their contents are hashed as one entry `part-*.parquet`.
- the build's and stats' rejects: every `rejects*.jsonl` file of a folder is hashed as one entry,
  its lines sorted, because a Beam text sink chooses the number of files and the order of lines
  at run time.
No file of these commands records a host name; every path in them is relative to the run's
working folder (the test runs in a temporary folder with relative paths).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from maskstream.cli import main

HASHES = Path(__file__).with_name("output_hashes.json")
DOCUMENTS = 120
ENCODER_OPTIONS = ["--model", "model", "--encoder-dtype", "float32", "--encoder-device", "cpu"]


def make_corpus(sample_corpus: Path, folder: Path) -> None:
    """Two JSONL files of the sample's first documents; the second ends with two malformed lines."""
    folder.mkdir()
    lines = sample_corpus.read_text(encoding="utf-8").splitlines()[:DOCUMENTS]
    half = DOCUMENTS // 2
    (folder / "part-0.jsonl").write_text("\n".join(lines[:half]) + "\n", encoding="utf-8")
    bad = ['{"text": "unterminated', '{"package": "no text field"}']
    (folder / "part-1.jsonl").write_text("\n".join(lines[half:] + bad) + "\n", encoding="utf-8")


def normalized(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name == "manifest.json":
        manifest = json.loads(data)
        manifest.pop("created_at")
        return json.dumps(manifest, sort_keys=True).encode("utf-8")
    return data


def output_hashes(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `folder`, normalized as the module says."""
    hashes: dict[str, str] = {}
    rejects: dict[str, list[bytes]] = {}
    parts: dict[str, list[str]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if re.fullmatch(r"rejects.*\.jsonl", path.name):
            rejects.setdefault(f"{path.parent.relative_to(folder).as_posix()}/rejects*.jsonl", []).extend(
                path.read_bytes().splitlines())
            continue
        if "/_cache/embeddings/" in name or "/_cache/general_frequency/" in name:
            parts.setdefault(f"{path.parent.relative_to(folder).as_posix()}/part-*.parquet", []).append(
                hashlib.sha256(path.read_bytes()).hexdigest())
            continue
        hashes[name] = hashlib.sha256(normalized(path)).hexdigest()
    for name, lines in rejects.items():
        hashes[name] = hashlib.sha256(b"\n".join(sorted(lines))).hexdigest()
    for name, digests in parts.items():
        hashes[name] = hashlib.sha256(" ".join(sorted(digests)).encode("ascii")).hexdigest()
    return dict(sorted(hashes.items()))


@pytest.mark.slow
def test_outputs_keep_their_hashes(sample_corpus: Path, tiny_bert: str, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_corpus(sample_corpus, tmp_path / "corpus")
    os.symlink(tiny_bert, tmp_path / "model")
    out = tmp_path / "out"
    commands = [
        ["stats", "--input", "corpus", "--output", "out/stats"],
        ["seeds", "--stats", "out/stats", "--output", "out/seeds/seeds.json", "--top-k", "8"],
        ["build", "--input", "corpus", "--stats", "out/stats", "--seeds", "out/seeds/seeds.json",
         "--output", "out/dataset", "--version", "v1", "--shard-rows", "40", *ENCODER_OPTIONS],
        ["update", "--input", "corpus", "--output", "out/updated", "--version", "v1", "--shard-rows", "40",
         "--top-k", "8", *ENCODER_OPTIONS],
        # Packed windows: the build forms packing groups over the whole corpus and so does the update.
        ["build", "--input", "corpus", "--stats", "out/stats", "--seeds", "out/seeds/seeds.json",
         "--output", "out/dataset-packed", "--version", "v1", "--shard-rows", "40", "--packing", "pack",
         "--pack-group-size", "16", *ENCODER_OPTIONS],
        ["update", "--input", "corpus", "--output", "out/updated-packed", "--version", "v1", "--shard-rows", "40",
         "--top-k", "8", "--packing", "pack", "--pack-group-size", "16", *ENCODER_OPTIONS],
    ]
    for command in commands:
        assert main(command) == 0, command
    # A second update after one file changed: the cached file and embeddings are read back.
    with (tmp_path / "corpus" / "part-0.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "Zymurgical quixotry: a flibbertigibbet toolkit for protein folding."}) + "\n")
    assert main(["update", "--input", "corpus", "--output", "out/updated", "--version", "v2", "--shard-rows", "40",
                 "--top-k", "8", *ENCODER_OPTIONS]) == 0
    found = output_hashes(out)
    for built, updated in (("dataset", "updated"), ("dataset-packed", "updated-packed")):
        shards = sorted(name for name in found if re.fullmatch(rf"{built}/v1/(shard-.*|words/.*)\.parquet", name))
        assert shards and all(found[name] == found[name.replace(built, updated, 1)] for name in shards), built
    if os.environ.get("MASKSTREAM_RECORD_HASHES"):
        HASHES.write_text(json.dumps(found, indent=2) + "\n", encoding="utf-8")
    expected = json.loads(HASHES.read_text(encoding="utf-8"))
    assert found.keys() == expected.keys()
    changed = sorted(name for name in found if found[name] != expected[name])
    assert not changed, f"outputs changed: {changed}"

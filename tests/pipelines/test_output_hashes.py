"""Every output of `stats`, `seeds`, `build` and `update` keeps its content (issue 29 item 6, issue 51).

Fixed inputs (a slice of the shipped corpus in two files, plus two malformed lines so that the
rejects are written too), a fixed `--version`, the tiny BERT fixture as the encoder and
`--encoder-dtype float32`, so that the outputs depend only on the code and on the CPU's float kernels.

Two goldens, because the encoder's floats are not the same bytes on every CPU family (an Intel
machine with AVX-512 computes the embeddings, and so the similarities, mask probabilities and the
manifests' figures, a few units in the 7th digit apart from the AMD machine that recorded them):
- `output_hashes.json`: a sha256 per file of everything except its float values: the Parquet
  schema and every non-float column, the JSON structure with its strings and integers. These must
  match exactly on any machine.
- `output_floats.npz`: every float value (Parquet float columns, flattened; JSON numbers that are
  not integers), compared within FLOAT_TOLERANCE.
docs/building.md says what a rebuild on another machine reproduces exactly and what only within it.

A refactor must leave both as they are. A commit that changes an output on purpose re-records them
(run this file with MASKSTREAM_RECORD_HASHES=1) and says why in its message.

What is normalized before comparing, and why:
- `created_at` in manifest.json: the wall-clock time of the run.
- every sha256 and `bytes` in manifest.json: the shards' checksums and compressed sizes move with
  their float bytes; the shards themselves are compared here column by column.
- the part names of the embedding and word-frequency caches (`_cache/embeddings/KEY/part-TIME-RANDOM.parquet`,
  `_cache/general_frequency/...`): the time and a random suffix keep concurrent writers apart;
  the parts of a folder are compared as one table `part-*.parquet`, sorted by word.
- the build's and stats' rejects: every `rejects*.jsonl` file of a folder is one entry, its lines
  sorted, because a Beam text sink chooses the number of files and the order of lines at run time.
No file of these commands records a host name; every path in them is relative to the run's
working folder (the test runs in a temporary folder with relative paths).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from maskstream.cli import main

HASHES = Path(__file__).with_name("output_hashes.json")
FLOATS = Path(__file__).with_name("output_floats.npz")
# Measured on the recording machine: its AVX2 kernels against those without SIMD
# (ATEN_CPU_CAPABILITY=default) differ by at most 1.2e-6 (docs/building.md).
FLOAT_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
DOCUMENTS = 120
ENCODER_OPTIONS = ["--model", "model", "--encoder-dtype", "float32", "--encoder-device", "cpu"]
SHA256 = re.compile(r"[0-9a-f]{64}")


def make_corpus(sample_corpus: Path, folder: Path) -> None:
    """Two JSONL files of the sample's first documents; the second ends with two malformed lines."""
    folder.mkdir()
    lines = sample_corpus.read_text(encoding="utf-8").splitlines()[:DOCUMENTS]
    half = DOCUMENTS // 2
    (folder / "part-0.jsonl").write_text("\n".join(lines[:half]) + "\n", encoding="utf-8")
    bad = ['{"text": "unterminated', '{"package": "no text field"}']
    (folder / "part-1.jsonl").write_text("\n".join(lines[half:] + bad) + "\n", encoding="utf-8")


def _is_float(kind: pa.DataType) -> bool:
    while pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind) or pa.types.is_large_list(kind):
        kind = kind.value_type
    return pa.types.is_floating(kind)


def _flat_values(column: pa.ChunkedArray) -> np.ndarray:
    values = column.combine_chunks()
    while pa.types.is_list(values.type) or pa.types.is_fixed_size_list(values.type):
        values = pc.list_flatten(values)
    return values.to_numpy(zero_copy_only=False)


def split_table(table: pa.Table) -> tuple[bytes, dict[str, np.ndarray]]:
    """(the schema and the non-float columns as bytes, {float column: its values flattened})."""
    exact = [name for name in table.column_names if not _is_float(table.schema.field(name).type)]
    text = table.schema.to_string(show_schema_metadata=False) + json.dumps(table.select(exact).to_pydict(),
                                                                           sort_keys=True)
    floats = {name: _flat_values(table[name]) for name in table.column_names if name not in exact}
    return text.encode("utf-8"), floats


def split_json(value: Any, manifest: bool) -> tuple[bytes, dict[str, np.ndarray]]:
    """(the JSON with each float replaced by a marker, {"floats": the floats in document order}); in a
    manifest, checksums and file sizes are masked too."""
    found: list[float] = []

    def walk(item: Any) -> Any:
        if isinstance(item, float):
            found.append(item)
            return "<float>"
        if isinstance(item, dict):
            return {k: "<bytes>" if manifest and k == "bytes" else walk(v) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v) for v in item]
        if manifest and isinstance(item, str) and SHA256.fullmatch(item):
            return "<sha256>"
        return item

    text = json.dumps(walk(value), sort_keys=True)
    return text.encode("utf-8"), ({"floats": np.array(found)} if found else {})


def read_outputs(folder: Path) -> dict[str, tuple[bytes, dict[str, np.ndarray]]]:
    """{relative path: (exact bytes, float values)} of every file under `folder`, normalized as the
    module says."""
    out: dict[str, tuple[bytes, dict[str, np.ndarray]]] = {}
    rejects: dict[str, list[bytes]] = {}
    parts: dict[str, list[pa.Table]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        parent = path.parent.relative_to(folder).as_posix()
        if re.fullmatch(r"rejects.*\.jsonl", path.name):
            rejects.setdefault(f"{parent}/rejects*.jsonl", []).extend(path.read_bytes().splitlines())
        elif "/_cache/embeddings/" in name or "/_cache/general_frequency/" in name:
            parts.setdefault(f"{parent}/part-*.parquet", []).append(pq.read_table(path))
        elif path.suffix == ".parquet":
            out[name] = split_table(pq.read_table(path))
        elif path.suffix == ".json":
            data = json.loads(path.read_bytes())
            if path.name == "manifest.json":
                data.pop("created_at")
            out[name] = split_json(data, manifest=path.name == "manifest.json")
        else:
            out[name] = (path.read_bytes(), {})
    for name, lines in rejects.items():
        out[name] = (b"\n".join(sorted(lines)), {})
    for name, tables in parts.items():
        table = pa.concat_tables(tables)
        out[name] = split_table(table.take(pc.sort_indices(table, [("word", "ascending")])))
    return dict(sorted(out.items()))


def record(outputs: dict[str, tuple[bytes, dict[str, np.ndarray]]]) -> None:
    hashes = {name: hashlib.sha256(exact).hexdigest() for name, (exact, _) in outputs.items()}
    arrays, floats = {}, {}
    for name, (_, columns) in outputs.items():
        for column, values in columns.items():
            key = hashlib.sha256(values.tobytes()).hexdigest()[:16]  # the same values are stored once
            arrays[f"a{key}"] = values
            floats[f"{name}::{column}"] = f"a{key}"
    HASHES.write_text(json.dumps({"exact": hashes, "floats": floats}, indent=2) + "\n", encoding="utf-8")
    np.savez_compressed(FLOATS, **arrays)


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
    found = read_outputs(out)
    # On the same machine a build and an update write the same shard and word-table bytes.
    for built, updated in (("dataset", "updated"), ("dataset-packed", "updated-packed")):
        shards = sorted(p for p in (out / built / "v1").rglob("*.parquet"))
        assert shards and all(p.read_bytes() == (out / updated / p.relative_to(out / built)).read_bytes()
                              for p in shards), built
    if os.environ.get("MASKSTREAM_RECORD_HASHES"):
        record(found)
    golden = json.loads(HASHES.read_text(encoding="utf-8"))
    with np.load(FLOATS) as stored:
        arrays = {key: stored[key] for key in stored.files}
    assert found.keys() == golden["exact"].keys()
    changed = sorted(name for name, (exact, _) in found.items()
                     if hashlib.sha256(exact).hexdigest() != golden["exact"][name])
    assert not changed, f"outputs changed (beyond their float values): {changed}"
    columns = {f"{name}::{column}": values for name, (_, floats) in found.items() for column, values in floats.items()}
    assert columns.keys() == golden["floats"].keys()
    apart = {}
    for key, values in columns.items():
        expected = arrays[golden["floats"][key]]
        if values.shape != expected.shape or not np.allclose(values, expected, **FLOAT_TOLERANCE):
            apart[key] = float(np.max(np.abs(values - expected))) if values.shape == expected.shape else "shape"
    assert not apart, f"float values beyond {FLOAT_TOLERANCE}: {apart}"


@pytest.mark.slow
@pytest.mark.timeout(1200)  # beyond the child's own 900 s, so a hung child's output is shown, not cut
@pytest.mark.skipif(os.environ.get("HF_HUB_OFFLINE") == "1", reason="this process already runs with HF_HUB_OFFLINE=1")
def test_outputs_keep_their_hashes_with_hf_hub_offline(tmp_path: Path) -> None:
    """Issue 62: with HF_HUB_OFFLINE=1, transformers writes `"local_files_only": true` into a saved tokenizer
    config, which once changed the embedding cache's key. huggingface_hub reads the variable at import, so the
    test above runs again in a process started with it set (a worker of this run beside the others)."""
    import subprocess
    import sys

    node = f"{Path(__file__).resolve()}::test_outputs_keep_their_hashes"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MASKSTREAM_RECORD_HASHES", None)  # compare, never re-record, from the child
    env.pop("PYTEST_ADDOPTS", None)  # the parent's -n, --lf or -x would change what the child runs
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--basetemp", str(tmp_path / "basetemp"), node],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]

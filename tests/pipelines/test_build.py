"""`maskstream build` and `maskstream inspect` end to end on a slice of the shipped sample.

The word statistics and seeds these builds read are made here with `collections.Counter` under
the shared word normalization (the same words `maskstream stats` counts), so that the tests
control the vocabulary size; a tiny vocabulary keeps the encoder's work small.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maskstream.cli import EXIT_OS_ERROR, main
from maskstream.mask_signal.words import words
from maskstream.schemas.manifest import LATEST_POINTER, load_manifest, read_word_table
from maskstream.schemas.tables import SEQUENCE_SCHEMA, WORD_STATS_SCHEMA, WORD_TABLE_SCHEMA, check_schema

REPO_ROOT = Path(__file__).resolve().parents[2]
SEEDS = ["astronomy", "molecular", "protein", "simulation", "statistics"]


def make_inputs(sample_corpus: Path, folder: Path, documents: int) -> dict[str, str]:
    """A corpus of the first `documents` lines, its word statistics and a seeds.json."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(sample_corpus, encoding="utf-8") as f:
        lines = [line for _, line in zip(range(documents), f, strict=False)]
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(lines), encoding="utf-8")
    tf, df = Counter(), Counter()
    for line in lines:
        found = words(json.loads(line)["text"])
        tf.update(found)
        df.update(set(found))
    rows = [{"word": w, "tf": tf[w], "df": df[w], "general_frequency": 0.0, "tf_icf": 0.0} for w in sorted(tf)]
    (folder / "stats").mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=WORD_STATS_SCHEMA), folder / "stats" / "word_stats-00000-of-00001.parquet")
    seeds = folder / "seeds.json"
    seeds.write_text(json.dumps({"seeds": [{"word": s} for s in SEEDS]}), encoding="utf-8")
    return {"corpus": str(corpus), "stats": str(folder / "stats"), "seeds": str(seeds), "vocabulary": sorted(tf)}


def build_args(inputs: dict, output: str, *extra: str) -> list[str]:
    return ["build", "--input", inputs["corpus"], "--stats", inputs["stats"], "--seeds", inputs["seeds"],
            "--output", output, *extra]


def read_rows(version_url: str) -> pa.Table:
    _, manifest = load_manifest(version_url)
    tables = []
    for shard in manifest.shards:
        with fsspec.open(f"{version_url}/{shard.path}", "rb") as f:
            tables.append(pq.read_table(f))
    return pa.concat_tables(tables)


class EncoderSpy:
    """Counts every word the encoder model is called on, by wrapping the loaded model's forward."""

    def __init__(self):
        self.calls = 0
        self.rows: list[list[int]] = []

    def install(self, monkeypatch):
        import transformers

        original = transformers.AutoModel.from_pretrained

        def from_pretrained(*args, **kwargs):
            loaded = original(*args, **kwargs)  # (model, loading info) with output_loading_info=True
            model = loaded[0] if isinstance(loaded, tuple) else loaded

            def hook(module, args, kwargs):
                self.calls += 1
                ids = kwargs["input_ids"]
                mask = kwargs["attention_mask"]
                rows = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
                # A batch is filled up to its full size by repeating its last word (see
                # `word_batches`): those copies are not encodings of another word.
                while len(rows) > 1 and rows[-1] == rows[-2]:
                    rows.pop()
                self.rows.extend(rows)

            model.register_forward_pre_hook(hook, with_kwargs=True)
            return loaded

        monkeypatch.setattr(transformers.AutoModel, "from_pretrained", from_pretrained)


@pytest.fixture(scope="module")
def built(sample_corpus, tmp_path_factory, minilm_path):
    """One in-process build of 200 documents, with the encoder's inputs recorded."""
    monkeypatch = pytest.MonkeyPatch()
    spy = EncoderSpy()
    spy.install(monkeypatch)
    folder = tmp_path_factory.mktemp("build")
    inputs = make_inputs(sample_corpus, folder, 200)
    root = str(folder / "dataset")
    try:
        assert main(build_args(inputs, root, "--num-shards", "3", "--row-group-rows", "64", "--alpha", "0.9")) == 0
    finally:
        monkeypatch.undo()
    version_url, manifest = load_manifest(root)
    return {"inputs": inputs, "root": root, "version_url": version_url, "manifest": manifest, "spy": spy}


@pytest.mark.slow
def test_output_validates_against_the_schema(built):
    manifest, version_url = built["manifest"], built["version_url"]
    assert len(manifest.shards) == 3 and manifest.total_rows > 200
    for shard in manifest.shards:
        parquet = pq.ParquetFile(f"{version_url}/{shard.path}")
        check_schema(parquet.schema_arrow, SEQUENCE_SCHEMA, shard.path)
        assert parquet.metadata.num_rows == shard.rows
        assert all(parquet.metadata.row_group(i).num_rows <= 64 for i in range(parquet.num_row_groups))
    table = read_rows(version_url)
    assert table.column("sequence_id").to_pylist() == list(range(manifest.total_rows))  # dense, in shard order
    assert sum(len(x) for x in table.column("input_ids").to_pylist()) == manifest.total_tokens
    word_table = pq.read_table(f"{version_url}/{manifest.word_table}")
    check_schema(word_table.schema, WORD_TABLE_SCHEMA, "the word table")
    assert word_table.column("word").to_pylist() == built["inputs"]["vocabulary"]
    assert word_table.column("word_index").to_pylist() == list(range(len(built["inputs"]["vocabulary"])))
    seed_rows = [r for r in word_table.to_pylist() if r["word"] in SEEDS]
    assert all(r["nearest_seed"] == r["word"] and r["similarity"] == pytest.approx(1.0, abs=1e-5) for r in seed_rows)
    assert json.loads(Path(version_url, "seeds.json").read_text())["seeds"][0]["word"] == SEEDS[0]
    tokenizer = manifest.tokenizer
    assert (tokenizer["vocab_size"], tokenizer["mask_token_id"], tokenizer["pad_token_id"]) == (30522, 103, 0)
    assert manifest.source_fingerprint["documents"] == {"read": 200, "accepted": 200, "rejected": 0}
    assert Path(built["root"], LATEST_POINTER).read_text().strip() == manifest.version
    # Only the dataset's own files remain: the rows' intermediate parts are gone.
    assert not Path(version_url, "_parts").exists()


@pytest.mark.slow
def test_probabilities_sum_to_the_budget_and_specials_are_zero(built):
    table = read_rows(built["version_url"])
    budget = built["manifest"].config["budget"]
    for p, special, ids in zip(table.column("mask_probability").to_pylist(),
                               table.column("special_tokens_mask").to_pylist(),
                               table.column("input_ids").to_pylist(), strict=True):
        p, special = np.array(p, np.float64), np.array(special)
        assert len(p) == len(ids) <= 128
        assert np.all(p[special == 1] == 0) and np.all((p >= 0) & (p <= 1))
        # alpha < 1 gives every non-special token mass, so the budget is always reachable.
        assert p.sum() == pytest.approx(budget * (special == 0).sum(), rel=1e-5)


@pytest.mark.slow
def test_word_index_is_the_word_the_tokenizer_spells(built, minilm_path):
    """Each occurrence's tokens, joined as the tokenizer spells them, are its word-table word."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    vocabulary = built["inputs"]["vocabulary"]
    table = read_rows(built["version_url"]).slice(0, 80)
    checked = 0
    for row in table.to_pylist():
        tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
        occurrences: dict[int, list[int]] = {}
        for position, occurrence in enumerate(row["word_ids"]):
            if occurrence >= 0:
                occurrences.setdefault(occurrence, []).append(position)
        for positions in occurrences.values():
            assert positions == list(range(positions[0], positions[-1] + 1))  # contiguous
            indices = {row["word_index"][i] for i in positions}
            assert len(indices) == 1
            (index,) = indices
            spelled = tokenizer.convert_tokens_to_string([tokens[i] for i in positions]).replace(" ", "")
            if index < 0:
                assert not spelled.isalnum() or tokens[positions[0]] == "[UNK]"
            elif vocabulary[index].isascii() and "[UNK]" not in spelled:  # BERT strips accents
                assert vocabulary[index] == spelled
                checked += 1
    assert checked > 4000


@pytest.mark.slow
def test_encoder_sees_exactly_the_unique_words_and_seeds(built, minilm_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    spy = built["spy"]
    encoded = [tokenizer.decode(row, skip_special_tokens=True).replace(" ", "") for row in spy.rows]
    expected = sorted(set(built["inputs"]["vocabulary"]) | set(SEEDS))
    assert len(encoded) == len(expected)  # one encoding per unique word, none twice
    assert Counter(encoded) == Counter(tokenizer.decode(tokenizer(w, add_special_tokens=False)["input_ids"]).replace(" ", "")
                                       for w in expected)
    # Batched: 256 words of one token count per batch, so at most one partial batch per token count.
    assert spy.calls <= len(expected) / 256 + 16


@pytest.mark.slow
def test_manifest_records_the_resolved_encoder_dtype(built):
    from maskstream.pipelines.dataset.core.encoder_dtype import resolve_encoder_dtype

    manifest = built["manifest"]
    dtype = resolve_encoder_dtype("auto", "auto")  # the build ran with the default --encoder-dtype auto
    assert manifest.encoder["dtype"] == manifest.config["encoder_dtype"] == dtype


@pytest.mark.slow
def test_inspect_summarizes_marks_and_plots(built, tmp_path, capsys):
    plot = tmp_path / "hist.png"
    assert main(["inspect", built["root"], "--plot", str(plot), "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "all 3 shards match the manifest" in out and "[[" in out and built["manifest"].version in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_inspect_writes_no_file_unless_asked(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", built["root"], "--samples", "1", "--no-verify"]) == 0
    assert "signal" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_inspect_names_a_corrupted_shard(built, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(built["version_url"], copy)
    shard = built["manifest"].shards[1].path
    data = bytearray((copy / shard).read_bytes())
    data[100] ^= 0xFF
    (copy / shard).write_bytes(bytes(data))
    assert main(["inspect", str(copy), "--plot", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert shard in err and "does not match" in err


@pytest.mark.slow
def test_a_shard_has_the_same_bytes_whatever_order_its_parts_arrive_in(built, tmp_path):
    """`write_shard` from the build's rows (copied to 60 k rows, so that a column chunk spans several
    Parquet pages, whose boundaries follow the table's chunks) cut into parts, given in id order,
    reversed and interleaved (overlapping id ranges: re-sorted): byte for byte the file
    `write_parquet` makes of the rows sorted by id in one chunk."""
    from maskstream.pipelines.dataset.storage.dataset_writer import write_parquet, write_shard

    one = read_rows(built["version_url"]).sort_by("sequence_id")
    copies = -(-60_000 // one.num_rows)
    rows = pa.concat_tables([one] * copies).combine_chunks()
    rows = rows.set_column(0, rows.schema.field(0), pa.array(np.arange(rows.num_rows), pa.int64()))
    _, expected = write_parquet(rows, str(tmp_path / "expected.parquet"), 100_000)
    runs = [rows.slice(i, 1000) for i in range(0, rows.num_rows, 1000)]
    interleaved = [rows.filter(pa.array(np.arange(rows.num_rows) % 3 == r)) for r in range(3)]
    for name, parts in (("runs", runs), ("reversed", runs[::-1]), ("interleaved", interleaved)):
        entry = write_shard(str(tmp_path / name), 0, 1, parts, 100_000)
        assert (entry.sha256, entry.rows) == (expected, rows.num_rows), name


@pytest.mark.slow
def test_one_and_two_workers_give_the_same_rows(sample_corpus, tmp_path, subprocess_env):
    inputs = make_inputs(sample_corpus, tmp_path / "in", 25)
    versions = []
    for name, flags in (("one", []), ("two", ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])):
        root = str(tmp_path / name)
        result = subprocess.run([sys.executable, "-m", "maskstream", *build_args(inputs, root, "--packing", "pack",
                                 "--pack-group-size", "8", "--max-length", "96", "--encoder-threads", "1",
                                 "--version", "v1", *flags)],
                                env=subprocess_env, capture_output=True, text=True, cwd=REPO_ROOT)
        assert result.returncode == 0, result.stderr[-3000:]
        versions.append((read_rows(f"{root}/v1"), read_word_table(f"{root}/v1", "words")))
    assert versions[0][0].num_rows > 15
    assert versions[0][0].equals(versions[1][0])
    assert versions[0][1].equals(versions[1][1])  # the word table: every word's index, similarity, nearest seed


@pytest.mark.slow
def test_build_to_gcs_and_inspect_it(sample_corpus, tmp_path, gcs_bucket, capsys, tiny_encoder):
    inputs = make_inputs(sample_corpus, tmp_path / "in", 30)
    root = f"{gcs_bucket}/datasets/debian"
    # The tiny encoder: what is checked is where the files go, not what the embeddings hold.
    assert main(build_args(inputs, root, "--version", "v1", "--write-embeddings", "--model", tiny_encoder)) == 0
    version_url, manifest = load_manifest(root)
    assert version_url == f"{root}/v1" and manifest.total_rows >= 30
    fs = fsspec.filesystem("gcs")
    assert fs.cat_file(f"{root.removeprefix('gs://')}/latest").decode().strip() == "v1"
    (embeddings_file,) = fs.glob(f"{root.removeprefix('gs://')}/v1/embeddings/embeddings-*.parquet")
    embeddings = pq.read_table(fs.open(embeddings_file))
    assert embeddings.num_rows == len(set(inputs["vocabulary"]) | set(SEEDS))
    assert main(["inspect", root, "--plot", str(tmp_path / "gcs.png")]) == 0
    assert "match the manifest" in capsys.readouterr().out


@pytest.mark.slow
def test_a_failing_build_leaves_latest_on_the_previous_version(sample_corpus, tmp_path, monkeypatch, capsys,
                                                                tiny_encoder):
    import maskstream.pipelines.dataset.beam.dataset_pipeline as dataset_pipeline

    inputs = make_inputs(sample_corpus, tmp_path / "in", 30)
    root = str(tmp_path / "dataset")
    assert main(build_args(inputs, root, "--version", "good", "--num-shards", "2", "--model", tiny_encoder)) == 0
    original = dataset_pipeline.write_shard

    def write_shard(version_url, index, count, rows, row_group_rows):
        if index == 1:
            raise OSError("disk full (injected)")
        return original(version_url, index, count, rows, row_group_rows)

    monkeypatch.setattr(dataset_pipeline, "write_shard", write_shard)
    # The CLI ends with one line naming the error (maskstream.cli), exit status 74.
    assert main(build_args(inputs, root, "--version", "broken", "--num-shards", "2", "--model", tiny_encoder)) == \
        EXIT_OS_ERROR
    assert "disk full (injected)" in capsys.readouterr().err
    assert Path(root, LATEST_POINTER).read_text().strip() == "good"
    assert not Path(root, "broken", "manifest.json").exists()
    assert main(["inspect", root, "--plot", str(tmp_path / "p.png")]) == 0


@pytest.mark.slow
def test_a_killed_build_leaves_latest_on_the_previous_version(sample_corpus, tmp_path, subprocess_env):
    inputs = make_inputs(sample_corpus, tmp_path / "in", 30)
    root = tmp_path / "dataset"
    assert main(build_args(inputs, str(root), "--version", "good")) == 0
    command = [sys.executable, "-m", "maskstream", *build_args(inputs, str(root))]
    process = subprocess.Popen([*command, "--version", "killed"], env=subprocess_env, cwd=REPO_ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (root / "killed" / "seeds.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert (root / LATEST_POINTER).read_text().strip() == "good"
    assert not (root / "killed" / "manifest.json").exists()
    version_url, manifest = load_manifest(str(root))
    assert version_url.endswith("/good") and read_rows(version_url).num_rows == manifest.total_rows

"""`maskstream update`, `watch` and `gc`: only changed files are redone, and the result equals a
full rebuild's (and `maskstream stats` + `seeds` + `build`'s)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maskstream.cli import build_parser
from maskstream.cli.update import update_options
from maskstream.pipelines.dataset.storage.dataset_writer import verify_shard
from maskstream.pipelines.update.incremental import update
from maskstream.schemas.manifest import MANIFEST_NAME, load_manifest

FILES, DOCUMENTS_PER_FILE = 100, 2
NEW_DOCUMENT = {"package": "new", "text": "Zymurgical quixotry: a flibbertigibbet toolkit for sequence analysis."}


def make_corpus(sample_corpus: Path, folder: Path) -> Path:
    folder.mkdir(parents=True)
    lines = sample_corpus.read_text(encoding="utf-8").splitlines()[: FILES * DOCUMENTS_PER_FILE]
    for i in range(FILES):
        chunk = lines[i * DOCUMENTS_PER_FILE : (i + 1) * DOCUMENTS_PER_FILE]
        (folder / f"part-{i:03d}.jsonl").write_text("\n".join(chunk) + "\n", encoding="utf-8")
    return folder


def change_one_file(folder: Path) -> Path:
    path = folder / "part-042.jsonl"
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(NEW_DOCUMENT) + "\n")
    return path


def run_update(inputs: str, root: str, model: str, *extra: str) -> dict:
    from maskstream.pipelines.update.incremental import update

    args, _ = build_parser().parse_known_args(["update", "--input", inputs, "--output", root, "--shard-rows", "100",
                                               "--model", model, *extra])
    return update(update_options(args, args.input, args.output))


def read_version(url: str) -> tuple[pa.Table, pa.Table, list[str]]:
    url, manifest = load_manifest(url)
    rows = pa.concat_tables([pq.read_table(f"{url}/{s.path}") for s in manifest.shards])
    return rows, pq.read_table(f"{url}/words"), manifest.seeds


def assert_same_dataset(a: str, b: str) -> None:
    (rows_a, words_a, seeds_a), (rows_b, words_b, seeds_b) = read_version(a), read_version(b)
    assert seeds_a == seeds_b
    assert words_a.equals(words_b)
    assert rows_a.num_rows == rows_b.num_rows
    for column in rows_a.column_names:
        assert rows_a.column(column).equals(rows_b.column(column)), column
    # Byte-identical shards.
    assert [s.sha256 for s in load_manifest(a)[1].shards] == [s.sha256 for s in load_manifest(b)[1].shards]


@pytest.fixture(scope="module")
def first_build(sample_corpus: Path, tmp_path_factory, tiny_encoder: str) -> dict:
    """The update of a fresh root. Words are encoded by the tiny encoder: what these tests check (which
    files and words are redone, and that the result equals a full rebuild) does not depend on the
    encoder, and the MiniLM made the module several times slower."""
    base = tmp_path_factory.mktemp("incremental")
    corpus = make_corpus(sample_corpus, base / "corpus")
    root = base / "root"
    report = run_update(f"{corpus}/*.jsonl", str(root), tiny_encoder)
    return {"base": base, "corpus": corpus, "root": root, "report": report, "model": tiny_encoder}


@pytest.fixture(scope="module")
def second_build(first_build: dict) -> dict:
    """The update of `first_build`'s root after one file of its corpus changed: made once, by the first
    test that asks for it (each test builds what it needs, alone or in any order)."""
    change_one_file(first_build["corpus"])
    return run_update(f"{first_build['corpus']}/*.jsonl", str(first_build["root"]), first_build["model"])


@pytest.mark.slow
def test_change_one_file_redoes_only_that_file_and_equals_a_full_rebuild(first_build, second_build) -> None:
    corpus = first_build["corpus"]
    first = first_build["report"]
    assert first["counts"]["files_processed"] == FILES
    assert first["counts"]["documents_tokenized"] == FILES * DOCUMENTS_PER_FILE
    before = load_manifest(first["version"])[1]
    old_words = set(pq.read_table(f"{first['version']}/words").column("word").to_pylist()) | set(before.seeds)

    second = second_build
    assert second["counts"]["files_processed"] == 1
    assert second["counts"]["documents_tokenized"] == DOCUMENTS_PER_FILE + 1
    new_words = set(pq.read_table(f"{second['version']}/words").column("word").to_pylist()) | set(second["seeds"])
    assert second["counts"]["words_encoded"] == len(new_words - old_words) > 0
    assert {"zymurgical", "quixotry", "flibbertigibbet"} <= new_words - old_words

    full = run_update(f"{corpus}/*.jsonl", str(first_build["base"] / "fresh"), first_build["model"])
    assert full["counts"]["files_processed"] == FILES
    assert_same_dataset(second["version"], full["version"])
    # The earlier version stays readable and intact.
    url, manifest = load_manifest(first["version"])
    assert manifest.version == before.version
    assert all(verify_shard(url, shard) is None for shard in manifest.shards)


@pytest.mark.slow
def test_the_beam_path_writes_what_the_in_process_path_writes(first_build, second_build, monkeypatch) -> None:
    """Changes above IN_PROCESS_MAX_BYTES go through a Beam pipeline: the same cache entries, the same dataset."""
    from maskstream.pipelines.update import changed_files

    second = second_build
    corpus, base = first_build["corpus"], first_build["base"]
    monkeypatch.setattr(changed_files, "IN_PROCESS_MAX_BYTES", -1)
    with_beam = run_update(f"{corpus}/*.jsonl", str(base / "with-beam"), first_build["model"])
    assert with_beam["counts"]["files_processed"] == FILES and "process_files_ms" in with_beam["counts"]
    assert "process_files_ms" not in second["counts"]  # that one ran in its own process
    assert_same_dataset(second["version"], with_beam["version"])
    in_process = {p.relative_to(first_build["root"]): p.read_bytes()
                  for p in (first_build["root"] / "_cache" / "files").rglob("*.parquet")}
    beam = {p.relative_to(base / "with-beam"): p.read_bytes()
            for p in (base / "with-beam" / "_cache" / "files").rglob("*.parquet")}
    assert beam and all(in_process[path] == content for path, content in beam.items())


@pytest.mark.slow
def test_an_update_without_new_words_imports_neither_beam_nor_the_encoder(first_build, subprocess_env, tmp_path) -> None:
    from maskstream.pipelines.dataset.core.encoder_dtype import gpu_driver_present

    # A copy of the corpus and the dataset root: the copied files have new paths, so the first
    # update counts and tokenizes every one of them (in its process), and finds no new word.
    corpus, root = tmp_path / "corpus", tmp_path / "root"
    shutil.copytree(first_build["corpus"], corpus)
    shutil.copytree(first_build["root"], root)
    modules = ("torch", "transformers", "apache_beam")
    script = ("import json, sys\nfrom maskstream.cli import main\n"
              f"main(['--log-level', 'WARNING', 'update', '--input', '{corpus}/*.jsonl', "
              f"'--output', '{root}', '--shard-rows', '100', '--model', '{first_build['model']}'])\n"
              f"print(json.dumps({{name: name in sys.modules for name in {modules!r}}}))")
    files = len(list(corpus.glob("*.jsonl")))
    for processed in (files, 0):  # the copy's files, then nothing changed
        result = subprocess.run([sys.executable, "-c", script], env=subprocess_env, capture_output=True, text=True,
                                check=True)
        report = json.loads(result.stdout[: result.stdout.index("\n}\n") + 2])
        assert report["counts"]["files_processed"] == processed and report["counts"]["words_encoded"] == 0
        assert report["fixed_seconds"]["encoder_load"] is None and report["fixed_seconds"]["checks"] >= 0
        imported = json.loads(result.stdout.strip().splitlines()[-1])
        assert imported["apache_beam"] is False
        if not gpu_driver_present():  # with a GPU driver, `--encoder-dtype auto` asks torch
            assert imported == {"torch": False, "transformers": False, "apache_beam": False}


@pytest.mark.slow
def test_update_equals_stats_seeds_build(first_build, second_build, subprocess_env, tmp_path) -> None:
    from tests.conftest import run_cli

    second = second_build
    corpus = f"{first_build['corpus']}/*.jsonl"
    run_cli(["stats", "--input", corpus, "--output", str(tmp_path / "stats")], subprocess_env)
    run_cli(["seeds", "--stats", str(tmp_path / "stats"), "--output", str(tmp_path / "seeds.json")], subprocess_env)
    run_cli(["build", "--input", corpus, "--stats", str(tmp_path / "stats"), "--seeds", str(tmp_path / "seeds.json"),
             "--output", str(tmp_path / "dataset"), "--shard-rows", "100", "--model", first_build["model"]], subprocess_env)
    assert_same_dataset(second["version"], str(tmp_path / "dataset"))


@pytest.mark.slow
def test_the_encoder_dtype_is_in_the_manifest_and_keys_the_embedding_cache(first_build) -> None:
    from maskstream.pipelines.dataset.core.encoder_dtype import resolve_encoder_dtype
    from maskstream.pipelines.update.cache import encoder_key

    url, manifest = load_manifest(str(first_build["root"]))  # latest: the corpus as it is now
    dtype = resolve_encoder_dtype("auto", "auto")  # the default, --encoder-dtype auto
    assert manifest.encoder["dtype"] == manifest.config["encoder_dtype"] == dtype
    assert manifest.config["embedding_cache"] == encoder_key(manifest.encoder["name"], "mean", dtype)
    # The other dtype reads none of these embeddings: it encodes every word again, in its own cache.
    other = "float32" if dtype == "bfloat16" else "bfloat16"
    root = first_build["base"] / f"dtype-{other}"
    shutil.copytree(first_build["root"], root)
    args, _ = build_parser().parse_known_args(["update", "--input", f"{first_build['corpus']}/*.jsonl", "--output",
                                               str(root), "--shard-rows", "100", "--model", first_build["model"],
                                               "--encoder-dtype", other])
    report = update(update_options(args, args.input, args.output))
    assert report["counts"]["files_processed"] == 0 and report["counts"]["words_from_cache"] == 0
    _, changed = load_manifest(report["version"])
    assert changed.encoder["dtype"] == other
    assert changed.config["embedding_cache"] not in (manifest.config["embedding_cache"], None)
    assert {p.name for p in (root / "_cache" / "embeddings").iterdir()} == {
        manifest.config["embedding_cache"], changed.config["embedding_cache"]}
    before, after = (pq.read_table(f"{v}/words") for v in (url, report["version"]))
    assert before.column("word").equals(after.column("word"))
    similarity = [np.asarray(t.column("similarity").to_pylist()) for t in (before, after)]
    assert np.abs(similarity[0] - similarity[1]).max() < 0.01


@pytest.mark.slow
def test_gc_keeps_latest_and_removes_unused_cache(first_build, second_build, subprocess_env) -> None:
    from tests.conftest import run_cli

    root = first_build["root"]  # holds two versions: first_build's and second_build's
    copy = first_build["base"] / "gc-root"
    shutil.copytree(root, copy)
    (copy / "20000101T000000Z-broken").mkdir()  # an old incomplete version
    (copy / "20000101T000000Z-broken" / "shard-00000-of-00001.parquet").write_bytes(b"half")
    versions = sorted(p.name for p in copy.iterdir() if (p / MANIFEST_NAME).exists())
    latest = (copy / "latest").read_text().strip()
    entries = len(list((copy / "_cache" / "files").iterdir()))
    result = run_cli(["gc", str(copy), "--keep", "1", "--grace-minutes", "0"], subprocess_env)
    removed = json.loads(result.stdout.strip().splitlines()[-1])
    assert removed == {"versions": len(versions) - 1, "incomplete": 1, "files": 1, "embeddings": 0, "leases": 0}
    assert {p.name for p in copy.iterdir()} - {"_leases"} == {"_cache", latest, "latest"}
    assert len(list((copy / "_cache" / "files").iterdir())) == entries - 1
    url, manifest = load_manifest(str(copy))
    assert all(verify_shard(url, shard) is None for shard in manifest.shards)
    # Nothing the current corpus needs was removed: a rerun redoes no file and encodes no word.
    rerun = run_update(f"{first_build['corpus']}/*.jsonl", str(copy), first_build["model"])
    assert rerun["counts"]["files_processed"] == 0 and rerun["counts"]["words_encoded"] == 0
    # A young incomplete version (maybe being written) is left alone.
    (copy / "99990101T000000Z-writing").mkdir()
    (copy / "99990101T000000Z-writing" / "words.parquet").write_bytes(b"x")
    run_cli(["gc", str(copy), "--keep", "1"], subprocess_env)
    assert (copy / "99990101T000000Z-writing").exists()


def watched_copy(first_build, name: str) -> tuple[Path, Path]:
    """A copy of the corpus and of the root (its embedding cache makes the next build quick)."""
    base = first_build["base"] / name
    corpus = base / "corpus"
    shutil.copytree(first_build["corpus"], corpus)
    root = base / "root"
    shutil.copytree(first_build["root"] / "_cache" / "embeddings", root / "_cache" / "embeddings")
    return corpus, root


@pytest.mark.slow
def test_watch_builds_when_the_folder_changes(first_build) -> None:
    from maskstream.pipelines.update.watch import EXIT_BUILT, EXIT_UNCHANGED, Watcher

    corpus, root = watched_copy(first_build, "watch")
    args, _ = build_parser().parse_known_args(["watch", str(corpus), "--output", str(root), "--model",
                                               first_build["model"]])
    watcher = Watcher(str(corpus), update_options(args, [], str(root)), interval=0.2, settle=0.4)
    assert watcher.check() == EXIT_BUILT
    first_version = load_manifest(str(root))[1].version
    assert watcher.check() == EXIT_UNCHANGED

    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    time.sleep(0.5)
    change_one_file(corpus)
    deadline = time.monotonic() + 120
    while load_manifest(str(root))[1].version == first_version and time.monotonic() < deadline:
        time.sleep(0.2)
    watcher.stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive()
    url, manifest = load_manifest(str(root))
    assert manifest.version != first_version
    assert any(f["path"].endswith("part-042.jsonl") and f["bytes"] > 0 for f in manifest.source_fingerprint["files"])
    lines = sum(len(p.read_text().splitlines()) for p in corpus.glob("*.jsonl"))
    assert manifest.source_fingerprint["documents"]["accepted"] == lines


@pytest.mark.slow
def test_killed_watch_leaves_a_consistent_root(first_build, subprocess_env) -> None:
    corpus, root = watched_copy(first_build, "killed")
    first = run_update(f"{corpus}/*.jsonl", str(root), first_build["model"])
    change_one_file(corpus)
    process = subprocess.Popen(
        [sys.executable, "-m", "maskstream", "watch", str(corpus), "--output", str(root), "--interval", "0.2",
         "--settle", "0.2", "--model", first_build["model"]], env=subprocess_env, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if "corpus changed" in line:
            break

    def incomplete() -> list[Path]:
        return [p for p in root.iterdir() if p.name not in ("_cache", "_leases", "latest")
                and not (p / MANIFEST_NAME).exists()]

    deadline = time.monotonic() + 60
    while not incomplete() and time.monotonic() < deadline:  # the new version's folder: mid-build
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    url, manifest = load_manifest(str(root))
    assert url == first["version"]  # latest did not move
    assert all(verify_shard(url, shard) is None for shard in manifest.shards)
    assert len(incomplete()) == 1  # the killed build's folder: no manifest, so no reader takes it
    # The next run picks up where the killed one left off.
    after = run_update(f"{corpus}/*.jsonl", str(root), first_build["model"])
    assert after["counts"]["files_processed"] <= 1
    assert load_manifest(str(root))[0] == after["version"]


@pytest.mark.slow
def test_sigterm_during_a_build_finishes_it_then_stops(first_build, subprocess_env) -> None:
    corpus, root = watched_copy(first_build, "sigterm")
    process = subprocess.Popen(
        [sys.executable, "-m", "maskstream", "watch", str(corpus), "--output", str(root), "--interval", "0.2",
         "--settle", "0.2", "--model", first_build["model"]], env=subprocess_env, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if "corpus changed" in line:
            break
    process.send_signal(signal.SIGTERM)
    rest = process.stderr.read()
    assert process.wait(timeout=120) == 0
    assert "finishing the current build" in rest and "built" in rest and "stopped" in rest
    url, manifest = load_manifest(str(root))
    assert all(verify_shard(url, shard) is None for shard in manifest.shards)


@pytest.mark.slow
def test_with_a_word_count_threshold_a_word_crossing_it_gets_encoded_as_in_a_fresh_build(sample_corpus, tmp_path,
                                                                                         tiny_encoder):
    """--min-word-count 2: after an added document makes a word seen once occur twice, the update
    encodes it, and its rows equal a fresh update's and `maskstream stats` + `seeds` + `build`'s."""
    from maskstream.cli import main
    from maskstream.pipelines.dataset.core.vocabulary import SKIPPED

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = sample_corpus.read_text(encoding="utf-8").splitlines()[:40]
    for i in range(20):
        (corpus / f"part-{i:03d}.jsonl").write_text("\n".join(lines[2 * i : 2 * i + 2]) + "\n", encoding="utf-8")
    inputs, threshold = f"{corpus}/*.jsonl", ("--min-word-count", "2")
    first = run_update(inputs, str(tmp_path / "root"), tiny_encoder, *threshold)
    words = pq.read_table(f"{first['version']}/words").to_pylist()
    skipped = sorted(r["word"] for r in words if r["nearest_seed"] == SKIPPED and r["word"].isalpha())
    assert first["vocabulary"]["word_types_skipped"] >= len(skipped) > 0
    crossing = skipped[len(skipped) // 2]
    with (corpus / "part-003.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"package": "new", "text": f"A {crossing} toolkit for sequence analysis."}) + "\n")

    second = run_update(inputs, str(tmp_path / "root"), tiny_encoder, *threshold)
    row = {r["word"]: r for r in pq.read_table(f"{second['version']}/words").to_pylist()}[crossing]
    assert row["nearest_seed"] != SKIPPED
    assert second["counts"]["words_encoded"] >= 1
    assert second["vocabulary"]["word_types_skipped"] < first["vocabulary"]["word_types_skipped"]
    fresh = run_update(inputs, str(tmp_path / "fresh"), tiny_encoder, *threshold)
    assert_same_dataset(second["version"], fresh["version"])
    assert load_manifest(second["version"])[1].vocabulary == load_manifest(fresh["version"])[1].vocabulary

    assert main(["stats", "--input", inputs, "--output", str(tmp_path / "stats")]) == 0
    assert main(["seeds", "--stats", str(tmp_path / "stats"), "--output", str(tmp_path / "seeds.json")]) == 0
    assert main(["build", "--input", inputs, "--stats", str(tmp_path / "stats"), "--seeds", str(tmp_path / "seeds.json"),
                 "--output", str(tmp_path / "dataset"), "--shard-rows", "100", "--model", tiny_encoder, *threshold]) == 0
    assert_same_dataset(second["version"], str(tmp_path / "dataset"))


def test_cache_parts_are_compacted_and_a_reader_never_misses_a_row(tmp_path, monkeypatch) -> None:
    from fsspec.implementations.local import LocalFileSystem

    from maskstream.pipelines.update import cache

    folder = str(tmp_path / "general_frequency" / "en")
    parts = cache.PARTS_BEFORE_COMPACTION + 4
    for i in range(parts):
        cache.append_part(folder, pa.table({"word": [f"w{i}"], "frequency": [i / 100]}))
        assert len(list(Path(folder).glob("part-*.parquet"))) <= cache.PARTS_BEFORE_COMPACTION
    rows = pa.concat_tables(cache.read_parts(folder))
    assert sorted(rows.column("word").to_pylist()) == sorted(f"w{i}" for i in range(parts))
    assert not list(Path(folder).glob("*.tmp-*"))

    # A reader that listed the parts just before another update compacted them lists again.
    stale = sorted(str(p) for p in Path(folder).glob("part-*.parquet"))
    for i in range(cache.PARTS_BEFORE_COMPACTION):
        cache.append_part(folder, pa.table({"word": [f"x{i}"], "frequency": [0.5]}))
    assert not any(Path(p).exists() for p in stale)  # merged away
    real_glob, listings = LocalFileSystem.glob, []

    def glob_once_stale(self, pattern, **kwargs):
        listings.append(pattern)
        return stale if len(listings) == 1 else real_glob(self, pattern, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "glob", glob_once_stale)
    words = pa.concat_tables(cache.read_parts(folder)).column("word").to_pylist()
    assert len(listings) == 2
    assert set(words) == {f"w{i}" for i in range(parts)} | {f"x{i}" for i in range(cache.PARTS_BEFORE_COMPACTION)}


class _InstantEncoder:
    """Stands for a WordEncoder in the encoder's process: loads at once, encodes every word as ones."""

    def load(self) -> _InstantEncoder:
        self.encoder = self
        return self

    def batches(self, words: list[str]) -> list[list[str]]:
        return [list(words)]

    def encode(self, batch: list[str]) -> np.ndarray:
        return np.ones((len(batch), 2), np.float32)


def test_the_encoder_process_outlives_ctrl_c_and_sigterm_sent_to_its_group() -> None:
    import os

    from maskstream.pipelines.update import encoder_process

    pool, loading = encoder_process._encoder_process(_InstantEncoder())
    try:
        loading.result(timeout=120)
        child = pool.submit(os.getpid).result(timeout=60)
        assert child != os.getpid()
        # A terminal's Ctrl-C reaches the whole process group; `watch` finishes its rebuild first.
        os.kill(child, signal.SIGINT)
        os.kill(child, signal.SIGTERM)
        time.sleep(0.5)
        words, vectors = pool.submit(encoder_process._encode_in_encoder_process, ["a", "b"]).result(timeout=60)
        assert words == ["a", "b"] and vectors.shape == (2, 2)
    finally:
        encoder_process._encoder_process.cache_clear()
        pool.shutdown(wait=True)


@pytest.mark.slow
def test_the_encoder_process_ends_when_its_parent_is_killed(subprocess_env) -> None:
    import os

    script = ("import os, time\nfrom maskstream.pipelines.update import encoder_process\n"
              "from tests.pipelines.test_incremental import _InstantEncoder\n"
              "pool, loading = encoder_process._encoder_process(_InstantEncoder())\n"
              "loading.result()\nprint(pool.submit(os.getpid).result(), flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], env=subprocess_env, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat", encoding="ascii") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # ended, not yet reaped
                    return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    pytest.fail(f"the encoder process {child} outlived its killed parent")

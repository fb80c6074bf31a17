"""`maskstream update --peer-signals` (issue 52 item 5): the peers' counts are kept per file, so an
update after a tenth of the files changed counts only those, and writes the same collocations and
informativeness, byte for byte, as a fresh update and as `maskstream build --peer-signals`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from maskstream.schemas.manifest import load_manifest
from tests.conftest import run_cli
from tests.pipelines.test_incremental import run_update

FILES, DOCUMENTS_PER_FILE = 20, 10
PEER_FLAGS = ("--peer-signals", "--ngram-min-count", "2", "--pair-min-count", "2")


def table_hashes(dataset: str) -> dict[str, str]:
    url, manifest = load_manifest(dataset)
    entry = manifest.peer_signals
    return {name: hashlib.sha256(Path(url, entry[name]).read_bytes()).hexdigest()
            for name in ("collocations", "informativeness")}


@pytest.fixture(scope="module")
def corpus(sample_corpus: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("peer-incremental") / "corpus"
    folder.mkdir()
    lines = sample_corpus.read_text(encoding="utf-8").splitlines()[: FILES * DOCUMENTS_PER_FILE]
    for i in range(FILES):
        chunk = lines[i * DOCUMENTS_PER_FILE : (i + 1) * DOCUMENTS_PER_FILE]
        (folder / f"part-{i:03d}.jsonl").write_text("\n".join(chunk) + "\n", encoding="utf-8")
    return folder


@pytest.mark.slow
def test_an_update_after_a_tenth_changed_equals_a_fresh_update_and_the_build(corpus, subprocess_env, tmp_path,
                                                                            tiny_encoder):
    root = tmp_path / "root"
    inputs = f"{corpus}/*.jsonl"
    # The peers' tables count words, not embeddings: a tiny encoder with MiniLM's tokenizer spares encoding
    # every word type with the MiniLM three times, and the tables are the same.
    first = run_update(inputs, str(root), tiny_encoder, *PEER_FLAGS)
    assert first["counts"]["files_peer_counted"] == FILES
    before = table_hashes(first["version"])
    first_entries = set((root / "_cache" / "files").glob("*/peer/entry.json"))

    # A tenth of the files change: one loses a document, one gains a sentence of known words.
    changed = [corpus / "part-003.jsonl", corpus / "part-011.jsonl"]
    lines = changed[0].read_text(encoding="utf-8").splitlines()
    changed[0].write_text("\n".join(lines[1:]) + "\n", encoding="utf-8")
    with changed[1].open("a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "A command line tool for molecular dynamics. Open source machine learning."}) + "\n")

    second = run_update(inputs, str(root), tiny_encoder, *PEER_FLAGS)
    assert second["counts"]["files_peer_counted"] == 2
    after = table_hashes(second["version"])
    assert after != before  # the change reaches the tables

    fresh = run_update(inputs, str(tmp_path / "fresh"), tiny_encoder, *PEER_FLAGS)
    assert fresh["counts"]["files_peer_counted"] == FILES
    assert table_hashes(fresh["version"]) == after

    run_cli(["stats", "--input", inputs, "--output", str(tmp_path / "stats")], subprocess_env)
    run_cli(["seeds", "--stats", str(tmp_path / "stats"), "--output", str(tmp_path / "seeds.json")], subprocess_env)
    run_cli(["build", "--input", inputs, "--stats", str(tmp_path / "stats"), "--seeds", str(tmp_path / "seeds.json"),
             "--output", str(tmp_path / "built"), "--shard-rows", "100", "--model", tiny_encoder, *PEER_FLAGS], subprocess_env)
    assert table_hashes(str(tmp_path / "built")) == after
    assert load_manifest(str(tmp_path / "built"))[1].peer_signals == load_manifest(second["version"])[1].peer_signals

    # Counts made another way (here: an older format) are counted again, not summed with the others. The
    # entry is one the second update wrote, so of a file's current content: the first update's entries of
    # the two changed files are still there, and one of those, changed, would be read by no update.
    entry = sorted(set((root / "_cache" / "files").glob("*/peer/entry.json")) - first_entries)[0]
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "format": 0}))
    again = run_update(inputs, str(root), tiny_encoder, *PEER_FLAGS)
    assert again["counts"]["files_peer_counted"] == 1
    assert table_hashes(again["version"]) == after

    # Without the flag, the next update writes a version without them, and counts nothing for them.
    plain = run_update(inputs, str(root), tiny_encoder)
    assert "files_peer_counted" not in plain["counts"]
    assert load_manifest(plain["version"])[1].peer_signals == {}


def test_watch_builds_when_the_peer_signals_asked_for_are_not_the_latest_versions():
    from maskstream.pipelines.statistics.peer_formulas import PeerSignalSettings
    from maskstream.pipelines.update.options import UpdateOptions
    from maskstream.pipelines.update.watch import peer_signals_differ
    from maskstream.schemas.manifest import Manifest

    def manifest(peer_signals: dict) -> Manifest:
        return Manifest("v", "t", {}, {}, [], {}, {}, {}, [], peer_signals=peer_signals)

    def options(settings: PeerSignalSettings | None) -> UpdateOptions:
        return UpdateOptions(inputs=[], root="", build=None, peer_signals=settings)  # type: ignore[arg-type]

    built = manifest({"settings": {"ngram_min_count": 5, "max_collocations": 100_000, "pair_min_count": 3,
                                   "max_n": 5, "sentence_words": 64}})
    assert not peer_signals_differ(options(PeerSignalSettings()), built)
    assert peer_signals_differ(options(PeerSignalSettings(ngram_min_count=2)), built)
    assert peer_signals_differ(options(PeerSignalSettings()), manifest({}))
    assert peer_signals_differ(options(None), built)
    assert not peer_signals_differ(options(None), manifest({}))
    assert peer_signals_differ(options(PeerSignalSettings()), None)

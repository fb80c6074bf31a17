"""`MaskMap` and `DifferenceMaskingCollator` (issue 40): a version's signal applied at load time to any text.

Three builds of the whole shipped corpus (truncate, the tiny encoder): the MiniLM WordPiece tokenizer with
the paper's map, a byte-level BPE tokenizer with the sharpened map and a floor, a SentencePiece Unigram
tokenizer with the paper's map. On the first window of every document, the map's probabilities for the
window's text equal the shard's `mask_probability`; the collator draws the masks `maskstream train` draws.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from maskstream import DifferenceMaskingCollator, MaskMap
from maskstream.cli import main
from maskstream.mask_signal.mask_map import TokenizerMismatch, export_mask_map
from maskstream.mask_signal.peer_lookup import PeerSignals
from maskstream.schemas.manifest import load_manifest
from maskstream.trainer.collate import collate_sequences
from maskstream.trainer.masking import MaskingConfig, apply_masking
from testing.tokenizer_families import corpus_texts, train_family
from tests.pipelines.test_build import build_args, make_inputs, read_rows

# name -> (tokenizer family, build options)
BUILDS = {
    "wordpiece-paper": ("wordpiece", ["--peer-signals"]),  # and the peers' signals, for their strategies
    "bytelevel-sharpened": ("bytelevel", ["--sharpness", "8", "--floor", "0.01"]),
    "unigram-paper": ("unigram", []),
}
MAX_LENGTH = 64  # short windows: many documents are cut, so the first window is often not the whole text


@pytest.fixture(scope="module")
def builds(sample_corpus, tmp_path_factory, tiny_encoder, minilm_path):
    texts = corpus_texts(sample_corpus)
    folder = tmp_path_factory.mktemp("mask-map")
    inputs = make_inputs(sample_corpus, folder / "inputs", len(texts))
    out = {}
    for name, (family, options) in BUILDS.items():
        tokenizer_path = minilm_path if family == "wordpiece" else train_family(family, texts, folder / family)
        root = str(folder / name)
        assert main(build_args(inputs, root, "--model", tiny_encoder, "--tokenizer", tokenizer_path,
                               "--max-length", str(MAX_LENGTH), *options)) == 0
        out[name] = {"root": root, "tokenizer_path": tokenizer_path}
    return {"texts": texts, "builds": out}


def first_windows(root: str, texts: list[str], tokenizer) -> tuple[list[str], list[dict]]:
    """(the text of the first window of every document, that window's shard row). A document that fits is
    its whole text; a longer one is cut where its first window ends (the build cuts at a word start)."""
    rows = read_rows(load_manifest(root)[0]).to_pylist()
    first: dict[str, dict] = {}
    for row in rows:  # truncate: a document's windows have consecutive ids, the first the smallest
        if row["document_id"] not in first or row["sequence_id"] < first[row["document_id"]]["sequence_id"]:
            first[row["document_id"]] = row
    window_texts, windows = [], []
    for document_id, row in sorted(first.items(), key=lambda item: item[1]["sequence_id"]):
        text = texts[int(re.search(r"line (\d+)$", document_id).group(1)) - 1]
        body = [t for t, s in zip(row["input_ids"], row["special_tokens_mask"], strict=True) if not s]
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        assert encoded["input_ids"][: len(body)] == body, document_id
        if len(encoded["input_ids"]) > len(body):
            text = text[: encoded["offset_mapping"][len(body) - 1][1]]
        window_texts.append(text)
        windows.append(row)
    return window_texts, windows


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUILDS))
def test_the_map_gives_the_shards_probabilities_on_every_documents_first_window(builds, name, capsys):
    from transformers import AutoTokenizer

    build = builds["builds"][name]
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    mask_map = MaskMap.from_version(build["root"])
    texts, windows = first_windows(build["root"], builds["texts"], tokenizer)
    probabilities = mask_map.probabilities(texts, tokenizer, max_length=MAX_LENGTH)
    encoded = tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    worst = 0.0
    for ids, row, p in zip(encoded, windows, probabilities, strict=True):
        assert ids == row["input_ids"]
        worst = max(worst, float(np.abs(p - np.asarray(row["mask_probability"])).max()))
    assert len(windows) == len(builds["texts"]) and worst <= 1e-6
    # The budget is the build's: budget x non-special tokens, exactly where the map has a floor.
    if "sharpened" in name:
        sums = np.array([p.sum() for p in probabilities])
        tokens = np.array([sum(1 for s in row["special_tokens_mask"] if not s) for row in windows])
        assert np.abs(sums - 0.15 * tokens).max() < 1e-3
    assert mask_map.nbytes <= 18 * len(mask_map)  # the build's word lookup, issue 28
    with capsys.disabled():
        print(f"\n{name}: {len(windows)} first windows, max |map - shard| = {worst:.2e}, "
              f"{len(mask_map):,} word types in {mask_map.nbytes:,} bytes")


@pytest.mark.slow
def test_a_whole_text_longer_than_a_window_keeps_its_last_words_weight(builds):
    """The tokenizer's truncation may cut inside a word: that word's tokens still get its weight."""
    from transformers import AutoTokenizer

    build = builds["builds"]["bytelevel-sharpened"]
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    mask_map = MaskMap.from_version(build["root"])
    long_texts = [t for t in builds["texts"] if len(tokenizer(t)["input_ids"]) > 3 * MAX_LENGTH][:20]
    for p, ids in zip(mask_map.probabilities(long_texts, tokenizer, max_length=MAX_LENGTH),
                      tokenizer(long_texts, truncation=True, max_length=MAX_LENGTH)["input_ids"], strict=True):
        assert len(p) == len(ids) == MAX_LENGTH
        assert p[0] == 0 and p[-1] == 0 and abs(p.sum() - 0.15 * (MAX_LENGTH - 2)) < 1e-3 and p.min() >= 0


@pytest.mark.slow
def test_another_tokenizer_is_refused_in_one_line_unless_allowed(builds):
    from transformers import AutoTokenizer

    mask_map = MaskMap.from_version(builds["builds"]["wordpiece-paper"]["root"])
    other = AutoTokenizer.from_pretrained(builds["builds"]["unigram-paper"]["tokenizer_path"])
    with pytest.raises(TokenizerMismatch, match="allow_other_tokenizer=True") as refused:
        mask_map.probabilities(["protein folding"], other)
    assert "\n" not in str(refused.value)
    (p,) = mask_map.probabilities(["protein folding"], other, allow_other_tokenizer=True)
    assert len(p) == len(other("protein folding")["input_ids"])


@pytest.mark.slow
def test_export_writes_what_load_reads(builds, tmp_path):
    from transformers import AutoTokenizer

    build = builds["builds"]["bytelevel-sharpened"]
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    assert main(["export-map", build["root"], "--output", str(tmp_path / "map")]) == 0
    loaded, direct = MaskMap.load(str(tmp_path / "map")), MaskMap.from_version(build["root"])
    texts = builds["texts"][:200]
    for a, b in zip(loaded.probabilities(texts, tokenizer), direct.probabilities(texts, tokenizer), strict=True):
        assert np.array_equal(a, b)
    assert loaded.settings == direct.settings and loaded.settings.sharpness == 8.0
    document = json.loads((tmp_path / "map" / "mask_map.json").read_text())
    assert document["version"]["url"] == load_manifest(build["root"])[0]
    # The token table, against a mean computed here from the shards' rows.
    table = json.loads((tmp_path / "map" / "token_mask_probability.json").read_text())["mask_probability"]
    sums: dict[int, list[float]] = {}
    for row in read_rows(load_manifest(build["root"])[0]).to_pylist():
        for token, p, special in zip(row["input_ids"], row["mask_probability"], row["special_tokens_mask"], strict=True):
            if not special:
                sums.setdefault(token, []).append(p)
    assert len(table) == len(tokenizer)
    for token, values in list(sums.items())[:500]:
        assert math.isclose(table[token], float(np.mean(values)), abs_tol=1e-6)
    assert all(table[i] == 0 for i in tokenizer.all_special_ids)
    assert loaded.peer_signals is None and "peer_signals" not in document  # built without them


@pytest.mark.slow
def test_an_exported_map_carries_the_peer_signals(builds, tmp_path):
    build = builds["builds"]["wordpiece-paper"]
    assert main(["export-map", build["root"], "--output", str(tmp_path / "map")]) == 0
    loaded, direct = MaskMap.load(str(tmp_path / "map")), MaskMap.from_version(build["root"])
    assert direct.peer_signals is not None and loaded.peer_signals is not None
    assert loaded.peer_signals.collocations.keys() == direct.peer_signals.collocations.keys()
    for n, keys in direct.peer_signals.collocations.items():
        assert np.array_equal(loaded.peer_signals.collocations[n], keys)
    assert np.array_equal(loaded.peer_signals.mask_weight, direct.peer_signals.mask_weight)
    document = json.loads((tmp_path / "map" / "mask_map.json").read_text())
    assert document["peer_signals"]["formulas"]["collocations"] == "pmi-ngram-v2"


@pytest.mark.slow
def test_a_peer_strategy_without_the_signals_is_refused(builds):
    from transformers import AutoTokenizer

    from maskstream.mask_signal.peer_lookup import PeerSignalsMissing

    build = builds["builds"]["unigram-paper"]
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    with pytest.raises(PeerSignalsMissing, match="--peer-signals"):
        DifferenceMaskingCollator(MaskMap.from_version(build["root"]), tokenizer, "pmi_span")


def shard_masks(rows: list[dict], indices: list[int], strategy: str, masking: MaskingConfig, pad: int,
                epoch: int, signals: PeerSignals | None = None) -> dict[str, torch.Tensor]:
    """What `maskstream train` draws for these shard rows (maskstream.trainer.hf.MaskingCollator's steps),
    with the peer signals joined as the loader joins them when `signals` are given."""
    samples = [{**row, "sample_index": i} for row, i in zip(rows, indices, strict=True)]
    if signals is not None:
        samples = [{**s, "span_ids": signals.span_ids(np.array(s["word_ids"]), np.array(s["word_index"])),
                    "informativeness": signals.token_weights(np.array(s["word_index"]))} for s in samples]
    return apply_masking(collate_sequences(samples, pad), strategy, masking, seed=3, epoch=epoch)


@pytest.mark.parametrize("strategy", ["difference", "whole_word", "random", "span", "pmi_span", "difference_pmi_span",
                                      "informask"])
@pytest.mark.slow
def test_the_collator_draws_the_masks_maskstream_train_draws(builds, strategy):
    from transformers import AutoTokenizer

    build = builds["builds"]["wordpiece-paper"]
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    mask_map = MaskMap.from_version(build["root"])
    texts, windows = first_windows(build["root"], builds["texts"], tokenizer)
    masking = MaskingConfig.from_manifest(load_manifest(build["root"])[1], budget=0.15)
    collator = DifferenceMaskingCollator(mask_map, tokenizer, strategy, max_length=MAX_LENGTH, seed=3)
    collator.set_epoch(2)
    for start in range(0, 256, 32):
        indices = list(range(1000 + start, 1032 + start))
        ours = collator([{"text": t, "sample_index": i} for t, i in zip(texts[start:start + 32], indices, strict=True)])
        train = shard_masks(windows[start:start + 32], indices, strategy, masking, tokenizer.pad_token_id, epoch=2,
                            signals=mask_map.peer_signals)
        for key in ("input_ids", "attention_mask", "labels"):
            assert torch.equal(ours[key], train[key]), (strategy, start, key)
        assert (ours["labels"] != -100).any()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["wordpiece-paper", "bytelevel-sharpened", "unigram-paper"])
def test_tokenized_rows_with_or_without_offsets_mask_as_text_rows(builds, name):
    from transformers import AutoTokenizer

    build = builds["builds"][name]
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    mask_map = MaskMap.from_version(build["root"])
    texts, length = builds["texts"][300:364], 256
    encoded = tokenizer(texts, truncation=True, max_length=length, return_offsets_mapping=True)
    as_text = [{"text": t, "sample_index": i} for i, t in enumerate(texts)]
    with_offsets = [{"text": t, "input_ids": ids, "offset_mapping": o, "sample_index": i}
                    for i, (t, ids, o) in enumerate(zip(texts, encoded["input_ids"], encoded["offset_mapping"], strict=True))]
    ids_only = [{"input_ids": ids, "sample_index": i} for i, ids in enumerate(encoded["input_ids"])]
    collator = DifferenceMaskingCollator(mask_map, tokenizer, max_length=length)
    expected, got = collator(as_text), collator(with_offsets)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    # Ids alone: the text comes back by decoding, but a word the truncation cut comes back cut (and is
    # another word); rows the truncation did not cut mask as their text does.
    whole = [i for i, ids in enumerate(encoded["input_ids"]) if len(ids) < length]
    assert len(whole) >= 32
    expected = collator([as_text[i] for i in whole])
    got = collator([ids_only[i] for i in whole])
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert collator.rows_without_words == 0
    if name == "wordpiece-paper":
        # Ids that do not decode back to themselves ("[CLS]inging..." encodes otherwise) are masked
        # without words, uniformly, and counted.
        piece = tokenizer.convert_tokens_to_ids("##ing")
        ids = [tokenizer.cls_token_id, *[piece] * 20, tokenizer.sep_token_id]
        batch = collator([{"input_ids": ids, "sample_index": 0}])
        assert collator.rows_without_words == 1 and int((batch["labels"] != -100).sum()) == 3


@pytest.mark.slow
def test_the_collator_in_a_multi_worker_dataloader_and_the_transformers_trainer(builds, tiny_bert, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForMaskedLM, AutoTokenizer, Trainer, TrainingArguments

    build = builds["builds"]["wordpiece-paper"]
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    collator = DifferenceMaskingCollator(MaskMap.from_version(build["root"]), tokenizer, max_length=MAX_LENGTH)
    rows = [{"text": t, "sample_index": i} for i, t in enumerate(builds["texts"][:96])]
    batches = {}
    for workers in (0, 2):
        loader = torch.utils.data.DataLoader(rows, batch_size=16, num_workers=workers, collate_fn=collator)
        batches[workers] = list(loader)
    assert len(batches[0]) == len(batches[2]) == 6
    for a, b in zip(batches[0], batches[2], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)

    # A streaming `datasets` IterableDataset of raw text, as docs/training.md shows.
    stream = Dataset.from_list([{"text": t} for t in builds["texts"][:200]]).to_iterable_dataset()
    model = AutoModelForMaskedLM.from_pretrained(tiny_bert)
    args = TrainingArguments(str(tmp_path / "hf"), max_steps=4, per_device_train_batch_size=8, report_to=[],
                             logging_steps=1, use_cpu=True, learning_rate=1e-3, remove_unused_columns=False,
                             save_strategy="no")
    result = Trainer(model=model, args=args, train_dataset=stream, data_collator=collator).train()
    assert math.isfinite(result.training_loss) and result.global_step == 4


@pytest.mark.slow
def test_the_collator_numbers_rows_without_an_index_apart_per_worker(builds):
    from transformers import AutoTokenizer

    build = builds["builds"]["wordpiece-paper"]
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    collator = DifferenceMaskingCollator(MaskMap.from_version(build["root"]), tokenizer)
    text = builds["texts"][5]
    first, second = collator([text]), collator([text])  # the same text, two samples: two masks
    assert torch.equal(first["attention_mask"], second["attention_mask"])
    assert not torch.equal(first["labels"], second["labels"]) and collator.rows_seen == 2


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_the_collator_numbers_rows_apart_per_rank(builds, monkeypatch, rank):
    """Copies on two ranks (torchrun's RANK and WORLD_SIZE) number rows without an index apart, so that
    rows of the same length on two ranks do not get the same mask."""
    from transformers import AutoTokenizer

    build = builds["builds"]["wordpiece-paper"]
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    collator = DifferenceMaskingCollator(MaskMap.from_version(build["root"]),
                                         AutoTokenizer.from_pretrained(build["tokenizer_path"]))
    assert collator.sample_indices(["a text", "another text", "a third"]) == [rank, 2 + rank, 4 + rank]


@pytest.mark.slow
def test_export_sizes_are_reported(builds, tmp_path):
    written = export_mask_map(builds["builds"]["wordpiece-paper"]["root"], str(tmp_path / "m"))
    assert written["word_types"] == len(MaskMap.load(str(tmp_path / "m")))
    assert written["total_bytes"] == sum(p.stat().st_size for p in Path(tmp_path / "m").iterdir())


@pytest.mark.slow
def test_a_map_from_and_to_a_bucket(builds, gcs_bucket):
    """from_version on a gs:// root, export-map to gs://, MaskMap.load from gs:// (the GCS emulator)."""
    import fsspec
    from transformers import AutoTokenizer

    build = builds["builds"]["unigram-paper"]
    gcs = fsspec.filesystem("gcs")
    root = f"{gcs_bucket}/datasets/unigram"
    gcs.put(build["root"], root.removeprefix("gs://"), recursive=True)
    assert main(["export-map", root, "--output", f"{gcs_bucket}/maps/unigram"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    texts = builds["texts"][:50]
    local = MaskMap.from_version(build["root"]).probabilities(texts, tokenizer)
    for remote in (MaskMap.from_version(root), MaskMap.load(f"{gcs_bucket}/maps/unigram")):
        assert remote.identity["url"].startswith("gs://")
        for a, b in zip(remote.probabilities(texts, tokenizer), local, strict=True):
            assert np.array_equal(a, b)


@pytest.mark.slow
def test_a_batch_mixing_text_tokenized_and_empty_rows(builds):
    from transformers import AutoTokenizer

    build = builds["builds"]["wordpiece-paper"]
    tokenizer = AutoTokenizer.from_pretrained(build["tokenizer_path"])
    collator = DifferenceMaskingCollator(MaskMap.from_version(build["root"]), tokenizer, max_length=MAX_LENGTH)
    text = builds["texts"][7]
    ids = tokenizer(text, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    rows = [{"text": text, "sample_index": 0}, {"text": "", "sample_index": 1},
            {"input_ids": ids, "sample_index": 0}, "[UNK] protein", {"input_ids": ids[:3], "sample_index": 4}]
    batch = collator(rows)
    assert batch["input_ids"].shape[0] == 5
    assert torch.equal(batch["labels"][0], batch["labels"][2])  # the same text, as text or as ids
    assert int((batch["labels"][1] != -100).sum()) == 0  # nothing to mask in an empty text
    with pytest.raises(ValueError, match="offset_mapping"):
        collator([{"text": text, "input_ids": ids, "offset_mapping": [[0, 1]], "sample_index": 0}])

"""The build's pure pieces and transforms, without the encoder: word alignment, windows, packing,
mask probabilities (checked against independent computations)."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from scipy.optimize import brentq
from scipy.stats import rankdata
from transformers import AutoTokenizer

from maskstream.mask_signal.alignment import align_tokens_to_words
from maskstream.mask_signal.probability import mask_probabilities_flat
from maskstream.mask_signal.words import word_spans
from maskstream.pipelines.corpus import Document
from maskstream.pipelines.dataset.beam.tokenize_to_windows import TokenizeToWindows
from maskstream.pipelines.dataset.core.sequences import cut_points
from maskstream.pipelines.dataset.core.tokenizer_facts import load_backend_tokenizer
from maskstream.pipelines.dataset.steps import vocabulary_index

MAX_LENGTH = 64


@pytest.fixture(scope="module")
def documents(sample_corpus) -> list[Document]:
    with open(sample_corpus, encoding="utf-8") as f:
        lines = [json.loads(line)["text"] for _, line in zip(range(120), f, strict=False)]
    return [Document(f"{sample_corpus}:line {i + 1}", str(sample_corpus), text) for i, text in enumerate(lines)]


def mask_probabilities(word_ids, word_index, special_tokens_mask, similarity, **options) -> list[np.ndarray]:
    """`mask_probabilities_flat` for a list of sequences, one array per sequence (as the build calls it on a
    batch's flat arrays)."""
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in word_ids])]).astype(np.int64)
    flat = [np.concatenate(a) if len(a) else np.zeros(0) for a in (word_ids, word_index, special_tokens_mask)]
    p = mask_probabilities_flat(*flat, offsets, similarity, **options)
    return [p[offsets[i] : offsets[i + 1]] for i in range(len(word_ids))]


def test_word_ids_follow_the_tokenizers_own_word_boundaries(sample_corpus, minilm_path):
    """Our occurrence ids group tokens exactly as the tokenizer's own word_ids() and pre-tokenizer do."""
    hf = AutoTokenizer.from_pretrained(minilm_path)
    backend = load_backend_tokenizer(minilm_path)
    checked = 0
    with open(sample_corpus, encoding="utf-8") as f:
        for _, line in zip(range(400), f, strict=False):
            text = json.loads(line)["text"]
            if not text.isascii():
                continue
            encoding = backend.encode(text, add_special_tokens=False)
            starts = np.array([s for s, _ in encoding.offsets])
            spans = word_spans(text)
            ours, span, _ = align_tokens_to_words(starts, np.array([e for _, e in encoding.offsets]),
                                                  np.array([s for s, _, _ in spans]), np.array([e for _, e, _ in spans]))
            theirs = hf(text, add_special_tokens=False).word_ids()
            # Same partition of tokens into words (the tokenizer numbers punctuation as words too).
            assert np.array_equal(np.diff(ours) != 0, np.diff(np.array(theirs)) != 0)
            pieces = hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)
            for token, occurrence_span in zip(range(len(starts)), span, strict=True):
                piece, (s, e) = next(p for p in pieces if p[1][0] <= starts[token] < p[1][1])
                assert (occurrence_span >= 0) == piece.isalnum()
            checked += 1
    assert checked > 300


def test_cut_points_never_split_a_word_unless_it_fills_the_window():
    word_ids = np.array([0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 3, 3, 4])
    assert cut_points(word_ids, 4) == [0, 3, 6, 10]  # the 6-token word 3 alone is split: it overfills a window
    assert cut_points(word_ids, 100) == [0]


def _rows(tables) -> list[SimpleNamespace]:
    """Tables of windows -> one object per window, list columns as numpy arrays."""
    rows = []
    for table in tables:
        for row in table.to_pylist():
            rows.append(SimpleNamespace(**{k: np.array(v) if isinstance(v, list) else v for k, v in row.items()}))
    return rows


def _flatten_bodies(windows) -> dict[str, list[int]]:
    by_unit: dict[str, list] = {}
    for w in sorted(windows, key=lambda w: (w.unit, w.window_index)):
        body = w.input_ids[w.special_tokens_mask == 0]
        by_unit.setdefault(w.unit, []).extend(body.tolist())
    return by_unit


def _check_windows(expected_tokens: dict[str, list[int]], packing: str, cls_id: int, sep_id: int):
    def check(tables):
        windows = _rows(tables)
        assert windows, "no windows"
        for w in windows:
            n = len(w.input_ids)
            assert 3 <= n <= MAX_LENGTH
            assert w.input_ids[0] == cls_id and w.input_ids[-1] == sep_id
            assert len(w.word_ids) == len(w.word_index) == len(w.special_tokens_mask) == n
            assert np.array_equal(w.special_tokens_mask == 1, w.word_ids == -1)
            ids = w.word_ids[w.word_ids >= 0]
            assert ids[0] == 0 and np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1)
        if packing == "truncate":
            assert _flatten_bodies(windows) == expected_tokens  # every token kept, in order
        else:
            got = Counter(t for tokens in _flatten_bodies(windows).values() for t in tokens)
            assert got == Counter(t for tokens in expected_tokens.values() for t in tokens)
            # Packed sequences are full, up to the tokens left over to avoid splitting a word at the cut;
            # only the last window of each packing group may be short.
            last = {}
            for w in windows:
                last[w.unit] = max(last.get(w.unit, 0), w.window_index)
            inner = [len(w.input_ids) for w in windows if w.window_index != last[w.unit]]
            assert min(inner) >= MAX_LENGTH - 8 and np.mean(inner) >= 0.97 * MAX_LENGTH

    return check


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["truncate", "pack"])
def test_tokenize_to_windows_keeps_every_token(documents, minilm_path, packing):
    backend = load_backend_tokenizer(minilm_path)
    expected = {d.document_id: backend.encode(d.text, add_special_tokens=False).ids for d in documents}
    vocabulary = sorted({w for d in documents for _, _, w in word_spans(d.text)})
    with TestPipeline() as p:
        vocab = p | "Vocab" >> beam.Create([vocabulary_index(vocabulary)])
        out = (
            p
            | beam.Create(documents)
            | TokenizeToWindows(minilm_path, beam.pvalue.AsSingleton(vocab), max_length=MAX_LENGTH, packing=packing,
                                pack_group_size=40)
        )
        assert_that(out["windows"] | beam.combiners.ToList(), lambda lists: _check_windows(
            expected, packing, 101, 102)(lists[0]))
        assert_that(out["rejects"], lambda rejects: not rejects or pytest.fail(f"{rejects}"), label="NoRejects")


def _reference_probabilities(weights: np.ndarray, valid: np.ndarray, alpha: float, budget: float) -> np.ndarray:
    """Independent: solve sum(min(1, c q)) = budget n for c with scipy's root finder."""
    n = valid.sum()
    q = np.where(valid, alpha * (weights / weights.sum() if weights.sum() > 0 else 1.0 / n) + (1 - alpha) / n, 0)
    target = budget * n
    if (q > 0).sum() <= target:
        return np.where(q > 0, 1.0, 0.0)
    c = brentq(lambda c: np.minimum(1.0, c * q).sum() - target, 0, 1e9, xtol=1e-12)
    return np.minimum(1.0, c * q)


@pytest.mark.parametrize("alpha", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("budget", [0.15, 0.6])
def test_mask_probabilities_match_a_root_finder_and_sum_to_the_budget(alpha, budget):
    rng = np.random.default_rng(0)
    similarity = rng.uniform(-0.2, 1.0, size=50)
    similarity[:3] = [50.0, 40.0, 30.0]  # a few dominant words force clipping
    sequences = []
    for length in (5, 17, 64, 128):
        special = np.zeros(length, np.int8)
        special[[0, -1]] = 1
        word_ids = np.where(special == 1, -1, np.arange(length) // 2).astype(np.int32)
        word_index = np.where(special == 1, -1, rng.integers(-1, 50, length)).astype(np.int32)
        word_index[1:-1][word_ids[1:-1] % 2 == 0] = word_index[1:-1][word_ids[1:-1] % 2 == 0]
        sequences.append((word_ids, word_index, special))
    got = mask_probabilities(*zip(*sequences, strict=True), similarity, budget=budget, alpha=alpha)
    for (_, word_index, special), p in zip(sequences, got, strict=True):
        valid = special == 0
        assert p.dtype == np.float32 and np.all(p[~valid] == 0) and np.all((p >= 0) & (p <= 1))
        weights = np.where(valid & (word_index >= 0), np.maximum(similarity[np.maximum(word_index, 0)], 0), 0.0)
        expected = _reference_probabilities(weights, valid, alpha, budget)
        np.testing.assert_allclose(p, expected, atol=1e-5)
        if (expected > 0).sum() > budget * valid.sum():
            assert p.sum() == pytest.approx(budget * valid.sum(), rel=1e-5)


def test_rank_weights_are_the_reference_n_minus_r_per_word_occurrence():
    similarity = np.array([0.9, 0.1, 0.5, 0.3])
    special = np.array([1, 0, 0, 0, 0, 0, 0, 1], np.int8)
    word_ids = np.array([-1, 0, 0, 1, 2, 3, 4, -1], np.int32)  # occurrence 0 has two tokens, 2 is punctuation
    word_index = np.array([-1, 1, 1, 0, -1, 2, 3, -1], np.int32)
    [p] = mask_probabilities([word_ids], [word_index], [special], similarity, budget=0.5, alpha=1.0, weighting="rank")
    # Independent: rank the 4 known occurrences by similarity with scipy (1 = most similar).
    occurrence_similarity = np.array([0.1, 0.9, 0.5, 0.3])
    rank = rankdata(-occurrence_similarity, method="ordinal")
    weight_per_occurrence = len(rank) - rank  # N - r
    token_weight = np.array([0, *[weight_per_occurrence[0]] * 2, weight_per_occurrence[1], 0,
                             weight_per_occurrence[2], weight_per_occurrence[3], 0], float)
    expected = _reference_probabilities(token_weight, special == 0, 1.0, 0.5)
    np.testing.assert_allclose(p, expected, atol=1e-6)
    assert p[1] == p[2]  # every token of a word gets the word's weight


@pytest.mark.parametrize("reduce", ["max", "mean", "centroid"])
def test_nearest_seed_similarity_matches_scikit_learn(reduce):
    from sklearn.metrics.pairwise import cosine_similarity
    from sklearn.preprocessing import normalize

    from maskstream.pipelines.dataset.steps import nearest_seed_similarity

    rng = np.random.default_rng(1)
    words_, seeds = rng.normal(size=(40, 16)), rng.normal(size=(5, 16))
    similarity, nearest = nearest_seed_similarity(words_, seeds, reduce)
    cosine = cosine_similarity(words_, seeds)
    expected = {
        "max": cosine.max(axis=1),
        "mean": cosine.mean(axis=1),
        # The centroid of the unit-length seed vectors.
        "centroid": cosine_similarity(words_, normalize(seeds).mean(axis=0, keepdims=True))[:, 0],
    }[reduce]
    np.testing.assert_allclose(similarity, expected, atol=1e-6)
    assert np.array_equal(nearest, cosine.argmax(axis=1))


@pytest.mark.parametrize("pooling", ["mean", "pooler"])
def test_word_encoder_pools_each_word_on_its_own(minilm_path, pooling):
    import torch
    from transformers import AutoModel, AutoTokenizer

    from maskstream.pipelines.dataset.beam.embeddings import WordEncoderHandler
    from maskstream.pipelines.dataset.core.word_encoder import WordEncoder

    handler = WordEncoderHandler(WordEncoder(minilm_path, pooling=pooling, device="cpu"))
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    encoder = handler.load_model()
    batch = ["genome", "x", "photosynthesis"]  # of different lengths: the batch is padded
    results = list(handler.run_inference(batch, encoder))
    model = AutoModel.from_pretrained(minilm_path).eval()
    for word, result in zip(batch, results, strict=True):
        assert result.example == word and result.inference.shape == (384,)
        ids = tokenizer(word, return_tensors="pt")  # [CLS] word [SEP], alone: no padding
        with torch.inference_mode():
            out = model(**ids)
        expected = out.pooler_output[0] if pooling == "pooler" else out.last_hidden_state[0, 1:-1].mean(0)
        np.testing.assert_allclose(result.inference, expected.numpy(), atol=1e-4)


def test_a_batch_is_tokenized_as_each_document_alone(documents, minilm_path):
    """Batching joins the documents' texts; every row must equal the document tokenized alone,
    and each token's word must be the normalized word its characters overlap."""
    from maskstream.pipelines.dataset.core.sequences import tokenize_documents

    extra = [Document("x:line 1", "x", "  \t  "), Document("x:line 2", "x", "Ünïcödé ﬁle naïve — İstanbul x² and Café")]
    batch = [*documents[:60], *extra]
    spelled = sorted({w for d in batch for _, _, w in word_spans(d.text)})
    vocabulary = {w: i for i, w in enumerate(w for i, w in enumerate(spelled) if i % 5)}  # rows: sorted order
    lookup = vocabulary_index(list(vocabulary))
    backend = load_backend_tokenizer(minilm_path)
    table, empty, _ = tokenize_documents(backend, batch, lookup)
    assert [d.document_id for d in empty] == ["x:line 1"]
    rows = {r["document_id"]: r for r in table.to_pylist()}
    assert len(rows) == len(batch) - 1
    for document in batch[:-2] + batch[-1:]:
        alone, _, _ = tokenize_documents(backend, [document], lookup)
        assert alone.to_pylist() == [rows[document.document_id]]
        encoding = backend.encode(document.text, add_special_tokens=False)
        spans = word_spans(document.text)
        expected = []
        for start, end in encoding.offsets:
            word = next((w for s, e, w in spans if start < e and s < end), None)
            expected.append(-1 if word is None else vocabulary.get(word, -1))
        assert rows[document.document_id]["word_index"] == expected
        assert rows[document.document_id]["input_ids"] == encoding.ids


@pytest.mark.parametrize("side", ["right", "left"])
def test_word_tokenizer_gives_the_hugging_face_ids_and_masks(minilm_path, tmp_path, side):
    """The encoder's Rust word tokenizer equals the HF call (padding, truncation to the word
    budget), on the model's own truncation and padding side."""
    import shutil

    from transformers import AutoTokenizer

    from maskstream.pipelines.dataset.core.word_encoder import load_word_tokenizer

    model = tmp_path / "model"
    shutil.copytree(minilm_path, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "truncation_side": side, "padding_side": side}))
    words = ["pneumonoultramicroscopicsilicovolcanoconiosis", "x", "genome", "photosynthesis", "naïve", "ﬁle"]
    hf = AutoTokenizer.from_pretrained(model)(words, padding=True, truncation=True, max_length=8,
                                                  return_special_tokens_mask=True)
    ours = load_word_tokenizer(str(model), 8).encode_batch(words)
    assert [e.ids for e in ours] == hf["input_ids"]
    assert [e.attention_mask for e in ours] == hf["attention_mask"]
    assert [e.special_tokens_mask for e in ours] == hf["special_tokens_mask"]
    assert len(ours[0].ids) == 8 and sum(ours[1].attention_mask) == 3  # truncated; padded

"""`--encoder-dtype`: how `auto` resolves, bfloat16 embeddings against float32 ones on real words
of the shipped sample, and the dtype in the config and the embedding-cache key."""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import numpy as np
import pytest
import torch

from maskstream.cli import build_parser
from maskstream.cli.build import build_config
from maskstream.cli.update import update_options
from maskstream.mask_signal.words import words
from maskstream.pipelines.dataset.beam.embeddings import WordEncoderHandler
from maskstream.pipelines.dataset.core import encoder_dtype
from maskstream.pipelines.dataset.core.encoder_dtype import resolve_encoder_dtype
from maskstream.pipelines.dataset.core.word_encoder import DEFAULT_EMBED_BATCH_SIZE, WordEncoder, word_batches
from maskstream.pipelines.dataset.steps import nearest_seed_similarity
from maskstream.pipelines.update.cache import encoder_key

SEEDS = ["astronomy", "molecular", "protein", "simulation", "statistics"]


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(encoder_dtype, "gpu_driver_present", lambda: False)


@pytest.fixture
def fake_cuda(monkeypatch):
    """A CUDA device whose native bf16 support the test sets; records the device asked about."""
    state = {"bf16": True, "devices": [], "emulation": []}

    def is_bf16_supported(including_emulation=True):
        state["emulation"].append(including_emulation)
        return state["bf16"]

    def device(which):
        state["devices"].append(str(which))
        return contextlib.nullcontext()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(encoder_dtype, "gpu_driver_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "device", device)
    return state


@pytest.mark.parametrize(("flags", "expected"), [
    ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
    ({"avx2", "amx_tile", "amx_bf16"}, "bfloat16"),
    ({"avx2", "avx512f", "avx512_vnni"}, "float32"),
    (set(), "float32"),  # no /proc/cpuinfo
])
def test_auto_on_cpu_follows_the_bf16_flags(monkeypatch, no_cuda, flags, expected):
    monkeypatch.setattr(encoder_dtype, "cpu_flags", lambda: flags)
    assert resolve_encoder_dtype("cpu", "auto") == expected
    assert resolve_encoder_dtype("auto", "auto") == expected  # no GPU: auto is the CPU


def test_auto_says_when_it_falls_back_to_float32(monkeypatch, no_cuda, caplog):
    caplog.set_level("INFO", logger="maskstream.embeddings")
    monkeypatch.setattr(encoder_dtype, "cpu_flags", lambda: {"avx2", "avx512_vnni"})
    assert resolve_encoder_dtype("cpu", "auto") == "float32"
    assert "cpu has no native bfloat16, so the encoder runs in float32" in caplog.text
    caplog.clear()
    monkeypatch.setattr(encoder_dtype, "cpu_flags", lambda: {"amx_bf16"})
    assert resolve_encoder_dtype("cpu", "auto") == "bfloat16"
    assert resolve_encoder_dtype("cpu", "float32") == "float32"  # asked for: nothing to say
    assert "float32" not in caplog.text


def test_cpu_flags_are_read_from_cpuinfo(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu sse2 avx512_bf16\n\nprocessor\t: 1\n")
    monkeypatch.setattr(encoder_dtype, "CPUINFO", str(cpuinfo))
    assert encoder_dtype.cpu_flags() == {"fpu", "sse2", "avx512_bf16"}
    monkeypatch.setattr(encoder_dtype, "CPUINFO", str(tmp_path / "missing"))
    assert encoder_dtype.cpu_flags() == set()


@pytest.mark.parametrize("native", [True, False])
def test_auto_on_cuda_asks_for_native_bf16(monkeypatch, fake_cuda, native):
    monkeypatch.setattr(encoder_dtype, "cpu_flags", lambda: {"avx512_bf16"})  # the CPU is not asked
    fake_cuda["bf16"] = native
    expected = "bfloat16" if native else "float32"
    assert resolve_encoder_dtype("auto", "auto") == expected
    assert resolve_encoder_dtype("cuda:1", "auto") == expected
    assert fake_cuda["devices"] == ["cuda", "cuda:1"] and fake_cuda["emulation"] == [False, False]
    assert resolve_encoder_dtype("cpu", "auto") == "bfloat16"  # an explicit CPU device on a GPU machine


def test_explicit_dtypes_are_kept_and_others_refused(monkeypatch, no_cuda):
    monkeypatch.setattr(encoder_dtype, "cpu_flags", lambda: set())
    assert resolve_encoder_dtype("cpu", "bfloat16") == "bfloat16"  # emulated, but asked for
    assert resolve_encoder_dtype("cuda", "float32") == "float32"
    with pytest.raises(ValueError, match="encoder-dtype"):
        resolve_encoder_dtype("cpu", "float16")
    with pytest.raises(ValueError, match="encoder-device"):
        resolve_encoder_dtype("nonsense", "auto")
    with pytest.raises(ValueError, match="resolve"):
        WordEncoder("any", dtype="auto")


@pytest.mark.parametrize("command", ["build", "update"])
def test_the_config_holds_the_resolved_dtype(monkeypatch, no_cuda, command):

    def config(*extra):
        io = ["--input", "x", "--output", "y"]
        if command == "build":
            args, _ = build_parser().parse_known_args(["build", *io, "--stats", "s", "--seeds", "j", *extra])
            return build_config(args)
        args, _ = build_parser().parse_known_args(["update", *io, *extra])
        return update_options(args, args.input, args.output).build

    monkeypatch.setattr(encoder_dtype, "cpu_flags", lambda: {"avx512_bf16"})
    assert config().encoder_dtype == "bfloat16"
    assert config("--encoder-dtype", "float32").encoder_dtype == "float32"
    monkeypatch.setattr(encoder_dtype, "cpu_flags", lambda: {"avx2"})
    assert config().encoder_dtype == "float32"
    assert config("--encoder-dtype", "bfloat16").encoder_dtype == "bfloat16"


def test_the_dtype_changes_the_embedding_cache_key(minilm_path):
    fp32, bf16 = encoder_key(minilm_path, "mean", "float32"), encoder_key(minilm_path, "mean", "bfloat16")
    assert fp32 != bf16
    assert fp32 == encoder_key(minilm_path, "mean")  # caches made before the dtype existed were float32
    assert encoder_key("some/model", "mean", "bfloat16") != encoder_key("some/model", "mean", "float32")


def test_the_batch_rows_change_the_embedding_cache_key(minilm_path):
    # `--embed-batch-size` pads every encoder call to its rows: another shape, maybe other last bits,
    # so an update with another batch size must not reuse the embeddings of this one.
    default = encoder_key(minilm_path, "mean", "bfloat16")
    assert default == encoder_key(minilm_path, "mean", "bfloat16", DEFAULT_EMBED_BATCH_SIZE)
    assert default != encoder_key(minilm_path, "mean", "bfloat16", 64)
    assert encoder_key(minilm_path, "mean", "bfloat16", 64) != encoder_key(minilm_path, "mean", "bfloat16", 0)


@pytest.fixture(scope="module")
def sample_words(sample_corpus) -> list[str]:
    """The 200 most frequent alphabetic words of 4+ letters in the shipped sample, seeds excluded."""
    counts = Counter()
    with open(sample_corpus, encoding="utf-8") as f:
        for line in f:
            counts.update(words(json.loads(line)["text"]))
    frequent = [w for w, _ in counts.most_common() if w.isalpha() and len(w) >= 4 and w not in SEEDS]
    return frequent[:200]


@pytest.fixture(scope="module")
def by_dtype(sample_words, minilm_path) -> dict[str, dict[str, np.ndarray]]:
    """Embeddings of the sample words and the seeds in each dtype, batched as the build batches."""
    wanted = sorted(set(sample_words) | set(SEEDS))
    result = {}
    for dtype in ("float32", "bfloat16"):
        handler = WordEncoderHandler(WordEncoder(minilm_path, device="cpu", batch_rows=256, dtype=dtype))
        model = handler.load_model()
        result[dtype] = {p.example: p.inference for batch in word_batches(wanted, minilm_path, 256)
                         for p in handler.run_inference(batch, model)}
    return result


def test_bfloat16_embeddings_are_close_to_float32(by_dtype, sample_words):
    fp32 = np.stack([by_dtype["float32"][w] for w in sample_words])
    bf16 = np.stack([by_dtype["bfloat16"][w] for w in sample_words])
    assert bf16.dtype == np.float32 and bf16.shape == fp32.shape == (200, 384)
    assert not np.array_equal(fp32, bf16)  # the autocast did run
    cosine = (fp32 * bf16).sum(1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(bf16, axis=1))
    assert cosine.min() >= 0.999, [(w, c) for w, c in zip(sample_words, cosine, strict=True) if c < 0.999]


def test_bfloat16_keeps_the_nearest_seeds_and_the_top_words(by_dtype, sample_words):
    scored = {}
    for dtype, embedded in by_dtype.items():
        similarity, nearest = nearest_seed_similarity(
            np.stack([embedded[w] for w in sample_words]), np.stack([embedded[s] for s in SEEDS]))
        scored[dtype] = similarity, nearest
    (sim32, near32), (sim16, near16) = scored["float32"], scored["bfloat16"]
    top32, top16 = np.argsort(-sim32, kind="stable")[:10], np.argsort(-sim16, kind="stable")[:10]
    assert [sample_words[i] for i in top16] == [sample_words[i] for i in top32]
    assert [SEEDS[n] for n in near16[top32]] == [SEEDS[n] for n in near32[top32]]
    # Every word whose two nearest seeds are not within bf16's wobble (~1e-3 in cosine) keeps its nearest.
    unit = {d: {w: v / np.linalg.norm(v) for w, v in e.items()} for d, e in by_dtype.items()}
    cosines = np.stack([[unit["float32"][w] @ unit["float32"][s] for s in SEEDS] for w in sample_words])
    ordered = np.sort(cosines, axis=1)
    clear = ordered[:, -1] - ordered[:, -2] > 0.005
    assert clear.sum() > 150
    assert np.array_equal(near16[clear], near32[clear])
    assert np.abs(sim16 - sim32).max() < 0.005


def test_bfloat16_pooler_output_is_float32_and_close(minilm_path):
    batch = ["genome", "x", "photosynthesis"]
    pooled = {}
    for dtype in ("float32", "bfloat16"):
        handler = WordEncoderHandler(WordEncoder(minilm_path, pooling="pooler", device="cpu", dtype=dtype))
        pooled[dtype] = np.stack([r.inference for r in handler.run_inference(batch, handler.load_model())])
    assert pooled["bfloat16"].dtype == np.float32
    cosine = (pooled["float32"] * pooled["bfloat16"]).sum(1) / (
        np.linalg.norm(pooled["float32"], axis=1) * np.linalg.norm(pooled["bfloat16"], axis=1))
    assert cosine.min() >= 0.999

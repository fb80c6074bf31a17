"""The word encoder's CPU runtimes side by side: speed, and agreement of the similarities they give.

    python -m benchmarks.encoder_runtime [--corpus data/debian-science.jsonl] [--threads 1]   # pip install -e '.[bench]'

Every distinct word of the corpus (the build's vocabulary) is encoded as the build encodes it
(`maskstream.pipelines.dataset.beam.embeddings`: `[CLS] word [SEP]`, mean over the word's own tokens, batches of words of
one token count) by the offline MiniLM in each runtime, then scored against seed words with
`nearest_seed_similarity`. Seeds: the 20 words of highest TF-ICF from `maskstream.pipelines.statistics.tf_icf` over
the corpus' counts (`collections.Counter`), after `maskstream seeds`' default filters. Runtimes:

- `torch float32`: the build's default, the reference;
- `torch bfloat16 autocast`: the build's `--encoder-dtype bfloat16` (what `auto` picks where the CPU
  computes bfloat16 natively); measured everywhere for its agreement, but where the CPU emulates
  bfloat16 (`auto` skips it there) its speed says nothing and is marked "emulated";
- `torch int8 dynamic`: `torch.ao.quantization.quantize_dynamic` on every `nn.Linear`;
- `onnxruntime float32`: the model exported with `torch.onnx.export`, run by ONNX Runtime;
- `onnxruntime int8 dynamic`: that export quantized by `onnxruntime.quantization.quantize_dynamic`.

Prints words/s, speed vs float32, Spearman correlation of every word's similarity with
float32's (scipy), and the overlap of the top 1 % most seed-similar words. The acceptance for a
new default (issue 20): Spearman >= 0.995, top-1 % overlap >= 0.98, >= 2x faster.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
BATCH = 256


def vocabulary_and_seeds(corpus: Path, top_k: int = 20) -> tuple[list[str], list[str]]:
    from wordfreq import word_frequency

    from maskstream.mask_signal.words import words
    from maskstream.pipelines.statistics.stop_words import ENGLISH_STOP_WORDS
    from maskstream.pipelines.statistics.tf_icf import tf_icf, wordfreq_floor

    tf: Counter[str] = Counter()
    for line in corpus.read_text(encoding="utf-8").splitlines():
        if line.strip():
            tf.update(words(json.loads(line)["text"]))
    vocabulary = sorted(tf)
    total = sum(tf.values())
    floor = wordfreq_floor()
    scores = {w: tf_icf(tf[w], total, word_frequency(w, "en"), floor) for w in vocabulary
              if tf[w] >= 5 and len(w) > 2 and w.isalpha() and w not in ENGLISH_STOP_WORDS}
    return vocabulary, sorted(scores, key=scores.get, reverse=True)[:top_k]


def batches(vocabulary: list[str], model: str) -> list[list[str]]:
    from maskstream.pipelines.dataset.core.word_encoder import word_batches

    return word_batches(vocabulary, model, BATCH)


def inputs_of(batch: list[str], model: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    from maskstream.models import MAX_WORD_TOKENS
    from maskstream.pipelines.dataset.core.word_encoder import load_word_tokenizer

    encodings = load_word_tokenizer(model, MAX_WORD_TOKENS).encode_batch(batch)
    own = np.array([e.attention_mask for e in encodings]) * (1 - np.array([e.special_tokens_mask for e in encodings]))
    return ({"input_ids": np.array([e.ids for e in encodings], np.int64),
             "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
             "token_type_ids": np.zeros((len(batch), len(encodings[0].ids)), np.int64)}, own.astype(np.float32))


def mean_pool(hidden: np.ndarray, own: np.ndarray) -> np.ndarray:
    return (hidden.astype(np.float32) * own[..., None]).sum(1) / np.maximum(own.sum(1, keepdims=True), 1)


def torch_runtime(model: str, kind: str) -> Callable[[dict, np.ndarray], np.ndarray]:
    import torch
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(model, attn_implementation="eager").eval()
    if kind == "int8":
        encoder = torch.ao.quantization.quantize_dynamic(encoder, {torch.nn.Linear}, dtype=torch.qint8)

    def encode(inputs: dict, own: np.ndarray) -> np.ndarray:
        tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "bfloat16"):
            hidden = encoder(**tensors).last_hidden_state.float().numpy()
        return mean_pool(hidden, own)

    return encode


def onnx_runtime(model: str, quantize: bool, folder: Path, threads: int) -> Callable[[dict, np.ndarray], np.ndarray]:
    import onnxruntime as ort
    import torch
    from transformers import AutoModel

    path = folder / "encoder.onnx"
    if not path.exists():
        encoder = AutoModel.from_pretrained(model, attn_implementation="eager").eval()

        class LastHiddenState(torch.nn.Module):  # named inputs in, one tensor out: what the exporter traces
            def __init__(self) -> None:
                super().__init__()
                self.encoder = encoder

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                    token_type_ids=token_type_ids).last_hidden_state

        names = ["input_ids", "attention_mask", "token_type_ids"]
        example = tuple(torch.ones(2, 4, dtype=torch.int64) for _ in names)
        torch.onnx.export(LastHiddenState().eval(), example, str(path), input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes={k: {0: "batch", 1: "tokens"} for k in names + ["last_hidden_state"]},
                          dynamo=False, opset_version=17)
    if quantize:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantized = folder / "encoder-int8.onnx"
        if not quantized.exists():
            quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8)
        path = quantized
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def encode(inputs: dict, own: np.ndarray) -> np.ndarray:
        (hidden,) = session.run(["last_hidden_state"], {k: v for k, v in inputs.items() if k in names})
        return mean_pool(hidden, own)

    return encode


def compare_runtimes(vocabulary: list[str], seeds: list[str], model: str, names: list[str], threads: int = 1
                     ) -> list[dict]:
    """One row per runtime in `names` (of the five the module docstring lists; "torch float32", the reference,
    is always measured first): words/s over `vocabulary`, speed vs float32, Spearman of every word's nearest-seed
    similarity with float32's, and the overlap of the top 1 % most seed-similar words."""
    import torch
    from scipy.stats import spearmanr

    from maskstream.pipelines.dataset.steps import nearest_seed_similarity

    torch.set_num_threads(threads)
    prepared = [(group, *inputs_of(group, model)) for group in batches(vocabulary, model)]
    seed_inputs = inputs_of(seeds, model)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        makers = {
            "torch float32": lambda: torch_runtime(model, "float32"),
            "torch bfloat16 autocast": lambda: torch_runtime(model, "bfloat16"),
            "torch int8 dynamic": lambda: torch_runtime(model, "int8"),
            "onnxruntime float32": lambda: onnx_runtime(model, False, Path(tmp), threads),
            "onnxruntime int8 dynamic": lambda: onnx_runtime(model, True, Path(tmp), threads),
        }
        for name in ["torch float32", *(n for n in names if n != "torch float32")]:
            try:
                encode = makers[name]()
            except ImportError as e:  # an optional peer (onnxruntime) that is not installed: said, not fatal
                print(f"  {name}: not measured ({e}; `pip install onnx onnxruntime` to include it)", flush=True)
                continue
            encode(*prepared[0][1:])  # warm-up
            start = time.perf_counter()
            embeddings = {w: e for group, inputs, own in prepared for w, e in zip(group, encode(inputs, own), strict=True)}
            seconds = time.perf_counter() - start
            matrix = np.stack([embeddings[w] for w in vocabulary])
            similarity, _ = nearest_seed_similarity(matrix, encode(*seed_inputs), "max")
            results[name] = (seconds, similarity)
            print(f"  {name}: {seconds:.1f} s", flush=True)

    base_seconds, base = results["torch float32"]
    top = max(1, len(vocabulary) // 100)
    base_top = set(np.argsort(-base)[:top])
    return [{"runtime": name, "words_per_s": len(vocabulary) / seconds, "speed": base_seconds / seconds,
             "spearman": spearmanr(base, similarity).statistic,
             "top_overlap": len(base_top & set(np.argsort(-similarity)[:top])) / top}
            for name, (seconds, similarity) in results.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=REPO_ROOT / "data" / "debian-science.jsonl")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads for every runtime (default: 1)")
    args = parser.parse_args()

    from maskstream.models import default_model
    from maskstream.pipelines.dataset.core.encoder_dtype import resolve_encoder_dtype

    vocabulary, seeds = vocabulary_and_seeds(args.corpus)
    print(f"{len(vocabulary)} word types of {args.corpus.name}; seeds: {', '.join(seeds)}")
    names = ["torch float32", "torch bfloat16 autocast", "torch int8 dynamic", "onnxruntime float32",
             "onnxruntime int8 dynamic"]
    native_bfloat16 = resolve_encoder_dtype("cpu", "auto") == "bfloat16"
    if not native_bfloat16:
        print("torch bfloat16 autocast: this CPU has no native bfloat16, so only its agreement counts")
    rows = compare_runtimes(vocabulary, seeds, default_model(), names, args.threads)
    print(f"\n| runtime ({args.threads} thread) | words/s | vs torch float32 | Spearman vs float32 | top-1 % overlap |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        emulated = " (emulated)" if r["runtime"] == "torch bfloat16 autocast" and not native_bfloat16 else ""
        print(f"| {r['runtime']} | {r['words_per_s']:,.0f} | {r['speed']:.2f}x{emulated} | {r['spearman']:.4f} "
              f"| {r['top_overlap']:.3f} |")


if __name__ == "__main__":
    main()

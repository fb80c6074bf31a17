"""The shipped masked LM's model card (`maskstream/english_mlm/README.md`): what it read, for how long and what
it reaches, written from its `general.json`, the pinned sources (`corpus.SOURCES`) and the fill-mask sentences
fixed before training (`fill_mask.json`). `pretrain.py`'s last step writes it; to write it again:

    python -m benchmarks.english_mlm.card          # from maskstream/english_mlm/ as shipped
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.english_mlm.corpus import SOURCES

FILL_MASK = Path(__file__).resolve().parent / "fill_mask.json"


def fill_mask(model: Path | str, sentences: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each fixed sentence's top-k guesses for its [MASK] (Hugging Face's fill-mask pipeline, float32, CPU)
    and whether one is an accepted answer; `passing` and whether the model reaches the mark (`passes`)."""
    # heavy: torch and transformers load only here
    import torch
    from transformers import pipeline

    spec = sentences or json.loads(FILL_MASK.read_text(encoding="utf-8"))
    fill = pipeline("fill-mask", model=str(model), dtype=torch.float32, device="cpu", top_k=spec["top_k"])
    rows = []
    for sentence in spec["sentences"]:
        guesses = [g["token_str"].strip() for g in fill(sentence["text"])]
        rows.append({"text": sentence["text"], "guesses": guesses,
                     "passes": any(answer in guesses for answer in sentence["answers"])})
    passing = sum(r["passes"] for r in rows)
    return {"top_k": spec["top_k"], "min_passing": spec["min_passing"], "sentences": rows, "passing": passing,
            "passes": passing >= spec["min_passing"]}


def card(record: dict[str, Any], filled: dict[str, Any]) -> str:
    """The card's Markdown."""
    shape, settings, corpus = record["shape"], record["settings"], record["corpus"]
    per_source = corpus.get("sources", {})
    curve = " → ".join(f"{e['accuracy']:.3f} ({e['step']:,})" for e in record["held_out_curve"]
                       if e["step"] % 2000 == 0 or e["step"] == settings["steps"])
    cpu_hours = record["seconds"] * record.get("threads", 1) / 3600
    lines = [
        "# maskstream's default masked LM (`english_mlm`)", "",
        "A small BERT-shaped masked language model, pretrained from scratch on general English by "
        "`benchmarks/english_mlm/pretrain.py` (issue 74). It is the default `--model` of `maskstream train` and "
        "`maskstream evaluate`: a model whose masked-LM head is trained, so that TAPT starts from a model that "
        "already predicts masked words. `build` keeps the MiniLM sentence encoder for scoring words.", "",
        "## What it is", "",
        f"- BERT, {shape['num_hidden_layers']} layers × {shape['hidden_size']} hidden, "
        f"{shape['num_attention_heads']} heads, intermediate {shape['intermediate_size']:,}; "
        f"{record['parameters']:,} parameters (the output layer tied to the word embeddings).",
        "- MiniLM's WordPiece vocabulary (uncased, 30,522): a dataset `build` makes at its defaults trains it.",
        f"- {record['max_length']} positions: `train` refuses a dataset built with a longer `--max-length`.",
        f"- Weights stored in float16 ({record['weights_bytes'] / 1e6:.1f} MB, sha256 `{record['weights_sha256']}`); "
        "maskstream loads them as float32.", "",
        "## What it read", "",
        f"{corpus['documents']:,} documents of general English written for general readers, from packages the "
        "registries serve, each pinned by version and sha256 (`benchmarks/english_mlm/corpus.py`). No Debian "
        "package description and no software documentation: those are the domains `evaluate` is judged on "
        "(`benchmarks/english_mlm/results/leak_check.json`: no near-duplicate of either task's texts).", "",
        "| source | version | license | documents | words | sha256 of the archive |",
        "| --- | --- | --- | ---: | ---: | --- |"]
    for source in SOURCES:
        counts = per_source.get(source.package, {})
        lines.append(f"| {source.description} (`{source.package}`) | {source.version} | {source.license} | "
                     f"{counts.get('documents', 0):,} | {counts.get('words', 0):,} | `{source.sha256[:16]}…` |")
    lines += [
        "", f"The texts' sha256 (joined by newlines): `{corpus['texts_sha256']}`. The weights are trained on texts "
        "under the licenses above; the code that made them is Apache-2.0.", "",
        "## For how long", "",
        f"BERT's random masking (15 %, 80/10/10), packed rows of {record['max_length']} tokens, batch "
        f"{settings['batch_size']}, AdamW at {settings['learning_rate']:g} ({settings['warmup_steps']} warm-up "
        f"steps, then linear decay), {settings['steps']:,} steps: "
        f"{settings['steps'] * settings['batch_size'] * record['max_length']:,} tokens, {record['passes']:.1f} passes over the {record['rows']['train']:,} training rows. "
        f"{record['seconds'] / 3600:.1f} hours on {record.get('threads', 1)} CPU threads ({cpu_hours:.1f} "
        f"CPU-hours; {record['hardware']['cpu']}, {record['hardware']['cpu_count']} cores), in resumable steps.", "",
        "## What it reaches", "",
        f"- Held-out masked-token accuracy (the {record['held_out']['masked_tokens']:,} masked tokens of "
        f"{record['rows']['held_out']:,} held-out rows, the same masks at every step): "
        f"**{record['held_out']['accuracy']:.3f}**, loss {record['held_out']['loss']:.2f}. Its curve, accuracy "
        f"(step): {curve}.",
        f"- Fill-mask on {len(filled['sentences'])} sentences it never read, fixed before training "
        f"(`benchmarks/english_mlm/fill_mask.json`): **{filled['passing']} of {len(filled['sentences'])}** have an "
        f"accepted answer among the top {filled['top_k']}; the mark was {filled['min_passing']}, so it "
        f"{'passes' if filled['passes'] else '**does not pass**'}.", "",
        "| sentence | top guesses | accepted answer among them |", "| --- | --- | --- |"]
    for row in filled["sentences"]:
        lines.append(f"| {row['text']} | {', '.join(row['guesses'][:5])} | {'yes' if row['passes'] else 'no'} |")
    lines += [
        "", "## What it is for, and not", "",
        "- It is small and read little: a probe on its features scores lower than one on a sentence encoder's "
        "(the MiniLM's), so `evaluate`'s `none` arm is lower with it. `evaluate` compares masking strategies on "
        "your data; its probe is not a classifier to keep.",
        "- It is English only, uncased, and knows the vocabulary of dictionaries, the Bible, Shakespeare and "
        "fortune cookies better than that of any technical field: that is what TAPT on your corpus is for.",
        ""]
    return "\n".join(lines)


def write_card(model: Path, filled: dict[str, Any] | None = None) -> Path:
    record = json.loads((model / "general.json").read_text(encoding="utf-8"))
    path = model / "README.md"
    path.write_text(card(record, filled or fill_mask(model)), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    from maskstream.models import default_mlm

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path(default_mlm()), help="the model folder (default: shipped)")
    args = parser.parse_args(argv)
    print(f"wrote {write_card(args.model)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

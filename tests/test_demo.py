"""The demo (scripts/demo.sh, `make demo`) as a newcomer reads it: its commands run on the first
200 documents of the shipped sample at the defaults a newcomer gets (build's word encoder, the offline
MiniLM; train's model, the general-English masked LM shipped with maskstream), and the output must hold no
alarming message, no figure twice and no path into the virtual environment."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_output(tmp_path_factory, subprocess_env, sample_corpus) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp("demo")
    corpus = folder / "corpus.jsonl"
    with open(sample_corpus, encoding="utf-8") as f:
        corpus.write_text("".join(line for _, line in zip(range(200), f, strict=False)), encoding="utf-8")
    out = folder / "out"
    # no MODEL: build and train each take their own default, as `make demo` does
    env = {k: v for k, v in subprocess_env.items() if k != "MODEL"}
    env.update({"OUT": str(out), "CORPUS": str(corpus), "MASKSTREAM": f"{sys.executable} -m maskstream"})
    # stdout and stderr in one stream, interleaved as a terminal shows them.
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "demo.sh")], env=env, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:]
    return result.stdout, out


@pytest.mark.slow
def test_no_alarming_message_and_only_the_classification_head_is_new(demo_output):
    output, _ = demo_output
    assert "corrupt" not in output.lower()
    assert "has no MLM head" not in output  # train's default model comes with its trained head
    assert output.count("has no classification head") == 1  # finetune's new head, said once in maskstream's words
    for noise in ("LOAD REPORT", "Loading weights", "Writing model shards", "Missing pipeline option", "MISSING",
                  "UNEXPECTED"):
        assert noise not in output, noise


@pytest.mark.slow
def test_the_signal_is_printed_once(demo_output):
    output, _ = demo_output
    for line in ("masking signal of built", "  group ", "most expected masks:", "frequent words, fewest masks",
                 "under other maps", "vocabulary       min word count"):
        assert output.count(line) == 1, line
    assert output.count("near-uniform masking signal") <= 1
    assert "the shards agree with the masking signal `maskstream build` printed" in output
    assert output.index("masking signal of built") < output.index("== maskstream inspect")


@pytest.mark.slow
def test_no_path_into_the_virtual_environment(demo_output):
    output, _ = demo_output
    assert "site-packages" not in output and "dist-packages" not in output
    if sys.prefix != sys.base_prefix:  # in a virtual environment: none of its paths either
        assert sys.prefix not in output


@pytest.mark.slow
def test_the_demo_ends_with_what_to_look_at_and_those_files_exist(demo_output):
    output, out = demo_output
    tail = output[output.index("What to look at:"):]
    named = {Path(p.rstrip(".,:")) for p in re.findall(re.escape(str(out)) + r"/[^\s,:()]+", tail)}
    assert len(named) >= 6
    missing = [str(p) for p in named if not p.exists()]
    assert not missing, missing


@pytest.mark.slow
def test_train_starts_from_a_model_that_already_predicts_masked_words(demo_output):
    """Issue 74: with the MiniLM (no trained MLM head) `train` started at masked-token accuracy 0.0000."""
    output, _ = demo_output
    before = re.search(r"before training: held-out loss [\d.]+, perplexity [\d.]+, masked-token accuracy ([\d.]+)",
                       output)
    assert before is not None, output[-3000:]
    assert float(before.group(1)) > 0.05

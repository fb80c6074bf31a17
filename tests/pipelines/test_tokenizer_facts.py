"""The tokenizer's facts (check, definition, token ids) are cached by its content: the next process
starts without transformers, and an edited tokenizer is looked at afresh."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from maskstream.pipelines.dataset.core import tokenizer_facts as facts_module
from maskstream.pipelines.dataset.core.tokenizer_facts import (
    compute_tokenizer_facts,
    content_key,
    tokenizer_facts,
)


@pytest.fixture
def tokenizer_copy(minilm_path, tmp_path) -> str:
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    for path in Path(minilm_path).iterdir():
        if path.is_file() and not path.name.endswith((".safetensors", ".bin")):
            shutil.copy(path, folder / path.name)
    return str(folder)


def test_facts_are_those_of_the_loaded_tokenizer(minilm_path):
    facts = compute_tokenizer_facts(minilm_path)
    hf = AutoTokenizer.from_pretrained(minilm_path)
    assert facts["problems"] == [] and facts["pack_problem"] is None
    assert facts["pack_separator"] == [hf.sep_token_id]
    assert facts["info"]["mask_token_id"] == hf.mask_token_id and facts["info"]["vocab_size"] == len(hf)
    text = "Zymurgical quixotry: naïve x86_64 toolkits."
    from tokenizers import Tokenizer

    assert Tokenizer.from_str(facts["backend"]).encode(text).ids == hf(text)["input_ids"]


@pytest.mark.slow
def test_the_cache_is_keyed_by_content(tokenizer_copy, tmp_path, monkeypatch, subprocess_env):
    monkeypatch.setenv("MASKSTREAM_CACHE", str(tmp_path / "cache"))
    key = content_key(tokenizer_copy)
    facts = tokenizer_facts.__wrapped__(tokenizer_copy)
    cached = tmp_path / "cache" / "tokenizers" / f"{key}.json"
    assert json.loads(cached.read_text()) == facts

    # A new process checks the tokenizer and tokenizes from the cache, without importing transformers.
    script = ("import sys\nfrom maskstream.pipelines.dataset.core.tokenizer_facts import check_tokenizer, load_backend_tokenizer\n"
              f"check_tokenizer({tokenizer_copy!r}, 'pack')\n"
              f"print(load_backend_tokenizer({tokenizer_copy!r}).encode('protein folding').ids)\n"
              "print('transformers' in sys.modules)")
    env = {**subprocess_env, "MASKSTREAM_CACHE": str(tmp_path / "cache")}
    lines = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert json.loads(lines[0]) == AutoTokenizer.from_pretrained(tokenizer_copy)("protein folding")["input_ids"]
    assert lines[1] == "False"

    # An edited tokenizer gets a new key; a damaged entry is recomputed.
    config = Path(tokenizer_copy) / "tokenizer_config.json"
    edited = json.loads(config.read_text())
    edited["model_max_length"] = 128
    config.write_text(json.dumps(edited))
    assert content_key(tokenizer_copy) != key
    damaged = tmp_path / "cache" / "tokenizers" / f"{content_key(tokenizer_copy)}.json"
    damaged.write_text("{not json")
    assert tokenizer_facts.__wrapped__(tokenizer_copy) == facts  # model_max_length is not among the facts
    assert json.loads(damaged.read_text()) == facts


def test_a_hub_name_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKSTREAM_CACHE", str(tmp_path / "cache"))
    assert content_key("sentence-transformers/all-MiniLM-L6-v2") is None
    assert facts_module.cache_root() == tmp_path / "cache"

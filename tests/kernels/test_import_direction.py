"""Data flows one way: the device probe below the Neuron registration, the kernel runner above
its failure reports. An AST scan of every import in harness/ (module level and inside
functions) must find no path back from the lower module to the higher one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The harness modules ``path`` imports anywhere (``from pkg import mod`` counts as pkg.mod)."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in HARNESS.rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, known) - {name} for name, path in files.items()}


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """An import path start -> ... -> goal, or None."""
    stack, seen = [[start]], {start}
    while stack:
        path = stack.pop()
        for nxt in graph.get(path[-1], ()):
            if nxt == goal:
                return path + [nxt]
            if nxt not in seen:
                seen.add(nxt)
                stack.append(path + [nxt])
    return None


ONE_WAY = [  # (higher, lower): the higher imports the lower, never the reverse
    ("harness.ops.neuron", "harness.devices"),
    ("harness.kernel_checks.runner", "harness.kernel_checks.diagnostics"),
]


@pytest.mark.parametrize(("higher", "lower"), ONE_WAY)
def test_no_import_path_leads_back_from_the_lower_module(higher, lower):
    graph = import_graph()
    assert lower in graph and higher in graph
    assert reaches(graph, lower, higher) is None, " -> ".join(reaches(graph, lower, higher))


def test_the_scan_sees_function_level_imports_and_would_report_a_cycle():
    source = "def probe():\n    from harness.ops.neuron import probe_module\n"
    tree_path = ROOT / "harness" / "devices.py"
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found.add(node.module)
    graph = import_graph()
    graph[module_name(tree_path)] = graph[module_name(tree_path)] | found  # the old devices.py edge
    assert reaches(graph, "harness.devices", "harness.ops.neuron") == ["harness.devices", "harness.ops.neuron"]

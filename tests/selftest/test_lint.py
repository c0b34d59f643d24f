"""The project's code meets its lint rules ([tool.ruff] in pyproject.toml), and every import
left inside a function says why (docs/extending.md, "Adding a test")."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINTED = ("harness", "tests", "scripts", "conftest.py")
LOCAL_IMPORT = re.compile(r"#\s*noqa:\s*(?:[A-Z]+[0-9]+,\s*)*PLC0415(?:,\s*[A-Z]+[0-9]+)*(?P<why>.*)$")


def ruff(*args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed: `python3 -m pip install -e . -c constraints/cpu.txt` installs it")
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def reasonless_local_imports(paths) -> list[str]:
    """Lines whose ``# noqa: PLC0415`` gives no reason (fewer than two words after it)."""
    bare = []
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found = LOCAL_IMPORT.search(line)
            if found and len(re.findall(r"[A-Za-z]{2,}", found["why"])) < 2:
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                bare.append(f"{shown}:{n}: {line.strip()}")
    return bare


def python_files():
    for name in LINTED:
        path = ROOT / name
        yield from ([path] if path.is_file() else sorted(path.rglob("*.py")))


def test_the_code_meets_the_projects_lint_rules():
    done = ruff("check", "--output-format", "concise", *LINTED)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_lint_finding_fails_the_check(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f(xs, ys):\n    import json\n    return list(zip(xs, ys)), json\n")
    done = ruff("check", "--output-format", "concise", "--config", str(ROOT / "pyproject.toml"), str(planted))
    assert done.returncode == 1 and "PLC0415" in done.stdout and "B905" in done.stdout, done.stdout


def test_every_import_inside_a_function_says_why():
    assert reasonless_local_imports(python_files()) == []


def test_a_local_import_without_a_reason_is_named(tmp_path):
    planted = tmp_path / "planted.py"
    noqa = "# noqa: " + "PLC0415"  # spelled apart, or this file would hold the line it plants
    planted.write_text(f"def f():\n    import json  {noqa}\n"
                       f"    import torch  {noqa}  heavy: the CLI answers without it\n")
    assert [line.split(": ", 1)[1] for line in reasonless_local_imports([planted])] == [f"import json  {noqa}"]

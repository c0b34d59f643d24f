"""An environment the harness cannot run in is refused before anything imports torchtitan.

Specification:
- the supported (torch, torchtitan, transformers) combinations live in one place
  (harness/registry/generations.py ``SUPPORTED`` and ``STACK``), and pyproject.toml's ranges say
  the same;
- on anything else, a pytest session and every command line stop before collection with one
  line naming what is installed, what is needed and the command that fixes it (exit status 4),
  never an INTERNALERROR or a traceback.
"""

import os
import subprocess
import sys
import tomllib

import pytest

from harness.registry import generations, paths

SUPPORTED = {"torch": "2.14.0", "torchtitan": "0.3.0", "transformers": "5.9.0"}


def _with(monkeypatch, **versions):
    have = {**SUPPORTED, **versions}
    monkeypatch.setattr(generations, "installed", lambda name: have[name])
    return generations.unsupported_stack()


@pytest.mark.parametrize("titan", ["0.3.0", "0.2.2+main.a9c5edc74", "0.2.2+neuron.1"])
def test_every_generation_on_the_neurons_torch_is_supported(monkeypatch, titan):
    assert _with(monkeypatch, torchtitan=titan) is None


@pytest.mark.parametrize("versions, says", [
    ({"torch": "2.11.0"}, "torch 2.11.0 is installed, torchtitan 0.3.0 and the harness need torch>=2.14.0,<2.15"),
    ({"torchtitan": None}, "torchtitan is not installed (needs torchtitan 0.3.0 or"),
    ({"torchtitan": "0.2.2"}, "torchtitan 0.2.2 is no supported generation"),
    ({"transformers": "4.57.1"}, "transformers 4.57.1 is installed"),
    ({"torch": None}, "torch is not installed (needs torch>=2.14.0,<2.15)"),
], ids=["old-torch", "no-torchtitan", "pypi-0.2.2", "transformers-v4", "no-torch"])
def test_an_unsupported_stack_is_one_line_with_what_is_installed_needed_and_the_fix(monkeypatch, versions, says):
    line = _with(monkeypatch, **versions)
    assert line is not None and says in line, line
    assert "\n" not in line and f"Fix: {generations.CPU_INSTALL}" in line


def test_pyproject_asks_for_the_same_stack():
    dependencies = tomllib.loads((paths.REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, spec in generations.STACK.items():
        assert f"{name}{spec}" in dependencies, (name, spec, dependencies)


@pytest.fixture
def torch_2_11(tmp_path):
    """A folder whose metadata says torch 2.11.0, first on the path: what importlib.metadata
    finds first is what the check reads (nothing is imported)."""
    info = tmp_path / "torch-2.11.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    return tmp_path


@pytest.mark.parametrize("command", [["-m", "pytest", "--co", "-p", "no:cacheprovider"],
                                     ["-m", "harness", "run"],
                                     ["-m", "harness.kernels.checks", "list"]],
                         ids=["pytest", "harness-run", "kernel-checks"])
def test_a_session_or_command_on_torch_2_11_stops_with_that_line(torch_2_11, command):
    done = subprocess.run([sys.executable, *command], cwd=paths.REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(torch_2_11)})
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 4, output[-2000:]
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and "torch 2.11.0 is installed" in lines[0], output[-2000:]

"""scripts/nightly/preflight.py: every precondition of the night, one table, a fix for each
failing one, and a non-zero exit when one that stops the night fails.

Specification:
- on a machine with no Neuron device (this one) it prints its table and exits 1, naming the
  missing device (and the rest that is missing) with the command that fixes each;
- the runner user may not be root (GitHub's runner refuses it); every path the night writes is
  checked writable, the fix naming the repository variable that moves it; the disk must hold the
  night's peak;
- an nki-library entry point whose signature no longer takes the harness's call (a parameter
  gone, a new required one, the required ones reordered) fails; a new optional one does not;
- the defaults of the night's folders are the runner's home, the same in the preflight and in
  scripts/nightly/image_env.sh (which exports them to the later steps).
Each check is shown failing here against a broken input.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections import namedtuple

import pytest

from harness.registry import environment, paths

NIGHTLY = paths.REPO_ROOT / "scripts" / "nightly"


def _preflight():
    spec = importlib.util.spec_from_file_location("nightly_preflight", NIGHTLY / "preflight.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _rows(table: str) -> dict[str, list[str]]:
    out = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith(("| precondition", "|---")):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            out[cells[0]] = cells[1:]
    return out


def test_without_a_neuron_device_it_fails_naming_what_is_missing_with_each_fix(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (environment.NEURON_STANDIN, "NEURON_VENV")}
    env.update(HOME=str(tmp_path), NEURON_OPT_ROOT=str(tmp_path / "opt"), HF_ENDPOINT="http://127.0.0.1:9")
    done = subprocess.run([sys.executable, str(NIGHTLY / "preflight.py")], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=170)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = _rows(done.stdout)
    assert rows["neuron device"][0] == "FAIL" and "neuron-ls" in rows["neuron device"][2]
    assert rows["Neuron venv"][0] == "FAIL" and "TRN2_NEURON_VENV" in rows["Neuron venv"][2]
    # no neuronx-cc here: nki-library does not import, which is not an entry point that moved
    assert rows["nki-library"][0] == "FAIL" and "neuronx-cc" in rows["nki-library"][2], rows
    assert not [name for name in rows if name.startswith("nki-library ")], rows
    for name, (status, _value, *fix) in rows.items():
        if status == "FAIL":
            assert fix and fix[0], f"{name} fails with no fix"
            assert f"::error::preflight: {name}:" in done.stdout
    assert "the night stops here" in done.stdout


def test_the_runner_user_may_not_be_root(monkeypatch):
    preflight = _preflight()
    monkeypatch.setattr(os, "getuid", lambda: 0)
    row = preflight.runner_user()
    assert not row.ok and "Must not run with sudo" in row.fix
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    assert preflight.runner_user().ok


def test_a_path_the_night_cannot_write_fails_naming_the_variable_that_moves_it(monkeypatch, tmp_path):
    preflight = _preflight()
    env = {"ASSETS_DIR": "/opt/hf-assets", "GITHUB_WORKSPACE": str(tmp_path), "RUNNER_TEMP": str(tmp_path)}
    monkeypatch.setattr(os, "access", lambda path, mode: not str(path).startswith("/opt"))
    rows = {r.name: r for r in preflight.path_rows(env)}
    assert not rows["writable: model assets"].ok
    assert "TRN2_ASSETS_DIR" in rows["writable: model assets"].fix
    assert rows["writable: reports"].ok


def test_the_disk_must_hold_the_nights_peak(monkeypatch, tmp_path):
    preflight = _preflight()
    usage = namedtuple("usage", "total used free")
    env = {"ASSETS_DIR": str(tmp_path / "a"), "C4_DIR": str(tmp_path / "c4")}
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage(0, 0, 30e9))
    row = preflight.disk_row(env)
    assert not row.ok and "48 GB" in row.value, row.value  # 8 + 20 to fetch, 8 + 10 + 2 to run
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage(0, 0, 60e9))
    assert preflight.disk_row(env).ok


def test_an_nki_library_entry_point_that_moved_on_fails():
    preflight = _preflight()
    expected = preflight.NKILIB_ENTRY_POINTS["experimental.loss.cross_entropy:cross_entropy_backward"]
    assert preflight.signature_problem(expected, list(expected)) is None
    assert preflight.signature_problem(expected, [*expected, ("fused", True)]) is None
    assert "missing ['inplace']" in preflight.signature_problem(expected, list(expected[:-1]))
    assert "new required ['lnc']" in preflight.signature_problem(expected, [*expected[:3], ("lnc", False),
                                                                            *expected[3:]])
    swapped = [expected[1], expected[0], *expected[2:]]
    assert "reordered" in preflight.signature_problem(expected, swapped)


def test_the_nights_folders_default_to_the_runners_home_alike_everywhere():
    preflight = _preflight()
    image_env = (NIGHTLY / "image_env.sh").read_text()
    for default in (preflight.DEFAULT_ASSETS, preflight.DEFAULT_C4, preflight.DEFAULT_HARNESS_VENV):
        assert default.startswith("$HOME/") and default in image_env, default
    workflow = (paths.REPO_ROOT / ".github" / "workflows" / "nightly-trn2.yml").read_text()
    assert "/opt/hf" not in workflow.split("jobs:")[1], "a night folder under /opt needs root"


def test_the_entry_points_the_harness_calls_are_the_installed_nki_librarys():
    """NKILIB_ENTRY_POINTS is what the harness was written for: the nki-library the harness is
    tested with (the standalone wheel, on the NKI emulator, as the rehearsed night checks it)
    has each of them, by signature. An entry point recorded where the library no longer has it
    (cross entropy back in core.loss) fails here, before a night."""
    if importlib.util.find_spec("nkilib_src") is None:
        pytest.skip("nki-library's wheel is not installed (package nkilib_src)")
    preflight = _preflight()
    rows = preflight.nkilib_rows(sys.executable, {**os.environ, environment.NEURON_STANDIN: "cpu"})
    assert len(rows) == len(preflight.NKILIB_ENTRY_POINTS), rows
    assert [(r.name, r.value) for r in rows if not r.ok] == []

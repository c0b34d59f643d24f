"""Sensitivity self-check: defects planted in the system under test are caught.

Each plant (harness/plants/in_torchtitan.py) changes torchtitan inside the launched ranks; the same checks
the e2e tests apply must then fail. One command: ``pytest -m slow tests/selftest/test_sensitivity.py``.
"""

import pytest

from harness.checks import run_checks as checks
from harness.launch.run import RunSpec

pytestmark = pytest.mark.slow

DEFECTS_IN_THE_MODEL = [
    "rope_theta_x10",          # wrong RoPE base in the native model
    "adapter_swaps_gate_up",   # HF checkpoint keys mapped to the wrong tensors
]


@pytest.mark.parametrize("plant", DEFECTS_IN_THE_MODEL)
def test_first_step_expectation_catches(plant, backend_runs):
    run = backend_runs.get(RunSpec("titan_native", init="pretrained", steps=2, plants=(plant,)))
    assert checks.completed(run, 2).problem is None, run.log_tails()
    verdict, _ = checks.verdict("first_step_loss", run, 2)
    assert verdict.status == "fail", f"{plant} went unnoticed: step-1 loss {run.steps[0].loss}"

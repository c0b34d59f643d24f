"""The checker catches planted defects: the kernel plants (harness/plants/kernels.py).

Every kind of assertion the conformance tests make -- values (rule 1 and the float64
arbitration behind it), gradients, routing sets, documented dtypes -- is shown failing here on
a deliberately broken implementation, through the same ``run`` the real ones use.
"""

from __future__ import annotations

import pytest

from harness import plants
from harness.kernels.checks.registry import OPS
from harness.kernels.checks.runner import run
from harness.kernels.checks.spec import dtype_name


def _check_caught(plant, case_name, dtype, tmp_path):
    op = OPS[plant.kernel.op]
    result = run(op, plant.kernel.implementation, "cpu", op.case(case_name), dtype, save_dir=tmp_path)
    assert not result.passed, f"plant {plant.name} ({plant.description}) was not caught:\n{result.report()}"
    failed = {check.name for check in result.failures}
    missing = set(plant.caught_by) - failed
    assert not missing, (f"{plant.name}: expected failing checks {sorted(missing)}; failed: {sorted(failed)}\n"
                         f"{result.report()}")
    for check in result.failures:
        arbitration = check.details.get("arbitration")
        if arbitration is not None:  # a defect must not survive arbitration either
            assert not arbitration["passed"], check.summary()
    assert result.replay_path is not None and result.replay_path.exists()


def _make_test(plant):
    catch_on = plant.kernel.catch_on

    @pytest.mark.parametrize(("case_name", "dtype"), list(catch_on), ids=[f"{c}-{dtype_name(d)}" for c, d in catch_on])
    def test(case_name, dtype, tmp_path):
        _check_caught(plant, case_name, dtype, tmp_path)

    test.__name__ = f"test_checker_catches_{plant.name}"
    test.__doc__ = f"Plant: {plant.description}."
    return test


# One test function per kernel plant: test_checker_catches_<plant>.
for _plant in plants.of("kernel"):
    globals()[f"test_checker_catches_{_plant.name}"] = _make_test(_plant)

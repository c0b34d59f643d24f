"""The checker catches planted defects (harness/kernel_checks/plants.py).

Every kind of assertion the conformance tests make -- values (rule 1 and the float64
arbitration behind it), gradients, routing sets, documented dtypes -- is shown failing here on
a deliberately broken implementation, through the same ``run`` the real ones use.
"""

from __future__ import annotations

import pytest

from harness.kernel_checks.plants import DEFECTS
from harness.kernel_checks.registry import OPS
from harness.kernel_checks.runner import run
from harness.kernel_checks.spec import dtype_name


def _check_caught(defect, case_name, dtype, tmp_path):
    op = OPS[defect.op]
    result = run(op, defect.impl, "cpu", op.case(case_name), dtype, save_dir=tmp_path)
    assert not result.passed, f"planted defect {defect.name} ({defect.description}) was not caught:\n{result.report()}"
    failed = {check.name for check in result.failures}
    missing = set(defect.failing_checks) - failed
    assert not missing, f"{defect.name}: expected failing checks {sorted(missing)}; failed: {sorted(failed)}\n{result.report()}"
    for check in result.failures:
        arbitration = check.details.get("arbitration")
        if arbitration is not None:  # a defect must not survive arbitration either
            assert not arbitration["passed"], check.summary()
    assert result.replay_path is not None and result.replay_path.exists()


def _make_test(defect):
    @pytest.mark.parametrize(
        ("case_name", "dtype"), list(defect.catch_on), ids=[f"{c}-{dtype_name(d)}" for c, d in defect.catch_on]
    )
    def test(case_name, dtype, tmp_path):
        _check_caught(defect, case_name, dtype, tmp_path)

    test.__name__ = f"test_checker_catches_{defect.name}"
    test.__doc__ = f"Planted defect: {defect.description}."
    return test


# One test function per defect: test_checker_catches_<defect>.
for _defect in DEFECTS:
    globals()[f"test_checker_catches_{_defect.name}"] = _make_test(_defect)

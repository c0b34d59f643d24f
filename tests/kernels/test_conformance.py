"""Conformance of every registered implementation against the float64 reference.

Generated from harness.kernels.checks.registry.OPS: op x implementation x device x case x dtype.
Each test checks forward outputs, the gradients of every differentiable input (for
implementations with a backward), the documented output dtypes and, for the router, the
routing-set rule. Unavailable libraries/devices give one skip per (op, impl, device) with the
reason. Known upstream issues (harness/registry/known_issues/kernels.py, check "kernel") are judged per
property (runner.outcome): a cell xfails only when every failing property is excused by an
issue and fails exactly as recorded; any other failure, or an excused property that passes,
fails (``known_issues.settle``).
"""

from __future__ import annotations

import warnings

import pytest

from harness.kernels.checks.registry import OPS
from harness.kernels.checks.runner import outcome, run
from harness.kernels.checks.spec import DEVICE_MARKERS, device_status, dtype_name
from harness.registry import known_issues


def _params():
    for op in OPS.values():
        for impl in op.implementations:
            for device in impl.devices:
                marks = [getattr(pytest.mark, DEVICE_MARKERS[device])] if device in DEVICE_MARKERS else []
                lib_ok, lib_reason = impl.requirement(device)()
                dev_ok, dev_reason = device_status(device)
                if not (lib_ok and dev_ok):
                    reason = lib_reason if not lib_ok else dev_reason
                    yield pytest.param(
                        op.name, impl.name, device, None, None,
                        marks=[*marks, pytest.mark.skip(reason=reason)], id=f"{op.name}-{impl.name}-{device}",
                    )
                    continue
                for case in op.cases:
                    if not impl.runs_case(device, case.name):
                        continue
                    for dtype in case.dtypes:
                        yield pytest.param(
                            op.name, impl.name, device, case.name, dtype, marks=list(marks),
                            id=f"{op.name}-{impl.name}-{device}-{case.name}-{dtype_name(dtype)}",
                        )


@pytest.mark.parametrize(("op_name", "impl_name", "device", "case_name", "dtype"), list(_params()))
def test_conformance(op_name, impl_name, device, case_name, dtype, tmp_path):
    op = OPS[op_name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # upstream warnings (CPU autocast) are known issues, not noise
        result = run(op, op.implementation(impl_name), device, op.case(case_name), dtype, save_dir=tmp_path)
    verdict = outcome(result)  # per property, judged against the known issues
    known_issues.settle(verdict, verdict.message, result.report())
    assert verdict.status == "pass" and not verdict.message, result.report()  # settled: not known, so clean

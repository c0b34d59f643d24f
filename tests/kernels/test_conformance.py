"""Conformance of every registered implementation against the float64 reference.

Generated from harness.kernels.registry.OPS: op x implementation x device x case x dtype.
Each test checks forward outputs, the gradients of every differentiable input (for
implementations with a backward), the documented output dtypes and, for the router, the
routing-set rule. Unavailable libraries/devices give one skip per (op, impl, device) with the
reason; known upstream findings are strict xfails (harness/kernels/findings.py).
"""

from __future__ import annotations

import warnings

import pytest

from harness.kernels.findings import finding_for
from harness.kernels.registry import OPS
from harness.kernels.runner import run
from harness.kernels.spec import DEVICE_MARKERS, device_status, dtype_name


def _params():
    for op in OPS.values():
        for impl in op.implementations:
            for device in impl.devices:
                marks = [getattr(pytest.mark, DEVICE_MARKERS[device])] if device in DEVICE_MARKERS else []
                lib_ok, lib_reason = impl.requires()
                dev_ok, dev_reason = device_status(device)
                if not (lib_ok and dev_ok):
                    reason = lib_reason if not lib_ok else dev_reason
                    yield pytest.param(
                        op.name, impl.name, device, None, None,
                        marks=[*marks, pytest.mark.skip(reason=reason)], id=f"{op.name}-{impl.name}-{device}",
                    )
                    continue
                for case in op.cases:
                    for dtype in case.dtypes:
                        case_marks = list(marks)
                        finding = finding_for(op.name, impl.name, case.name, dtype, device)
                        if finding is not None:
                            case_marks.append(pytest.mark.xfail(strict=True, reason=f"{finding.key} (harness/kernels/findings.py)"))
                        yield pytest.param(
                            op.name, impl.name, device, case.name, dtype, marks=case_marks,
                            id=f"{op.name}-{impl.name}-{device}-{case.name}-{dtype_name(dtype)}",
                        )


@pytest.mark.parametrize(("op_name", "impl_name", "device", "case_name", "dtype"), list(_params()))
def test_conformance(op_name, impl_name, device, case_name, dtype, tmp_path):
    op = OPS[op_name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # upstream warnings (CPU autocast) are findings, not noise
        result = run(op, op.implementation(impl_name), device, op.case(case_name), dtype, save_dir=tmp_path)
    assert result.passed, "\n" + result.report()

"""Known issues excuse exactly the property they document (harness/registry/known_issues/kernels.py, check
"kernel"; judged per property by harness/kernels/checks/runner.py).

Both directions on planted implementations run through the same ``run`` as the real ones,
registered under the real implementation's name so the known issue applies: the recorded
failure alone xfails; the recorded failure plus any other error fails; the excused property
passing (upstream fixed) fails; a failure of the excused property outside its signature fails.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from harness.kernels.checks.registry import OPS
from harness.kernels.checks.runner import judge, outcome, run

pytest.importorskip("torchtitan")
pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast:UserWarning")

BF16, F32 = torch.bfloat16, torch.float32


def _outcome(op_name, impl, case_name, dtype):
    op = OPS[op_name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run(op, impl, "cpu", op.case(case_name), dtype)
    return result, outcome(result)


def _titan(op_name):
    return OPS[op_name].implementation("torchtitan")


def _planted(op_name, change):
    """torchtitan's implementation, same name, with ``change(outputs)`` applied to its outputs."""
    real = _titan(op_name)
    return dataclasses.replace(real, run=lambda inputs, params, device: change(real.run(inputs, params, device)))


# ------------------------------------------------------------------ router: dtype of the scores only


def test_router_cell_with_only_the_recorded_dtype_failure_is_known():
    result, verdict = _outcome("moe_router", _titan("moe_router"), "single_token", BF16)
    assert verdict.status == "known", verdict.message
    statuses = {check.name: v.status for check, v in judge(result)}
    assert statuses["dtype:weights"] == "known"
    assert {s for name, s in statuses.items() if name != "dtype:weights"} == {"pass"}  # still checked


def test_router_cell_with_the_recorded_failure_and_wrong_weights_fails():
    planted = _planted("moe_router", lambda out: {**out, "weights": out["weights"] * 1.5})
    result, verdict = _outcome("moe_router", planted, "single_token", BF16)
    assert verdict.status == "fail" and "[weights]" in verdict.message, verdict.message
    assert {c.name: v.status for c, v in judge(result)}["dtype:weights"] == "known"


def test_router_cell_whose_scores_are_float32_fails_the_known_issue():
    """Upstream fixed: the excused property passes, so the entry must go."""
    planted = _planted("moe_router", lambda out: {**out, "weights": out["weights"].float()})
    _, verdict = _outcome("moe_router", planted, "single_token", BF16)
    assert verdict.status == "fail" and "but it passed" in verdict.message, verdict.message


def test_router_cell_with_another_wrong_dtype_fails():
    planted = _planted("moe_router", lambda out: {**out, "weights": out["weights"].half()})
    _, verdict = _outcome("moe_router", planted, "single_token", BF16)
    assert verdict.status == "fail" and "not as known issue" in verdict.message, verdict.message


# ------------------------------------------------------------------ RoPE: size of the value error only


def test_rope_long_positions_with_only_the_recorded_error_is_known():
    result, verdict = _outcome("rotary_embedding", _titan("rotary_embedding"), "long_positions", F32)
    assert verdict.status == "known", verdict.message
    statuses = {check.name: v.status for check, v in judge(result)}
    assert statuses == {"dtype:y": "pass", "y": "known", "grad_x": "known"}


def test_rope_long_positions_with_an_error_beyond_the_signature_fails():
    def shifted(out):
        y = out["y"]
        return {"y": y + 0.01 * y.detach().abs().amax()}  # ~1e6 u: another defect on top

    _, verdict = _outcome("rotary_embedding", _planted("rotary_embedding", shifted), "long_positions", F32)
    assert verdict.status == "fail" and "not as known issue" in verdict.message, verdict.message


def test_rope_long_positions_with_the_recorded_error_and_a_wrong_dtype_fails():
    planted = _planted("rotary_embedding", lambda out: {"y": out["y"].double()})
    result, verdict = _outcome("rotary_embedding", planted, "long_positions", F32)
    assert verdict.status == "fail" and "[dtype:y]" in verdict.message, verdict.message

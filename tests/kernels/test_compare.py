"""The comparison rules themselves (tolerances.py): each accepts what it should and rejects
what it should -- the rejections are this file's planted defects."""

from __future__ import annotations

import torch

from harness.kernels.checks import compare
from harness.registry.tolerances import UNIT_ROUNDOFF, lowest_precision
from harness.registry.tolerances import kernel_table as table
from harness.registry.tolerances import kernel_tolerance as tolerance

TOL_BF16 = tolerance("elementwise", torch.bfloat16)
TOL_ROUTING = tolerance("routing", torch.float32)


def _ref(seed=0, shape=(4, 64)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_policy_covers_every_class_and_precision_with_tau_a_multiple_of_u():
    for tol in table():
        assert tol.tau == tol.c * UNIT_ROUNDOFF[tol.precision] and tol.arbitration_factor >= 1
    assert lowest_precision(torch.float32, torch.bfloat16) == torch.bfloat16


def test_rule1_accepts_bf16_rounding_and_catches_one_wrong_element():
    b = _ref()
    assert compare.elementwise(b.bfloat16(), b, TOL_BF16)["passed"]
    broken = b.clone()
    broken[2, 5] *= 1.5  # planted: one element 50% off
    stats = compare.elementwise(broken, b, TOL_BF16)
    assert not stats["passed"] and stats["mismatched"] == 1 and stats["worst_index"] == (2, 5)
    assert stats["histogram"] and stats["rel_err"] > stats["tau"]


def test_rule1_row_scale_protects_tiny_rows():
    b = _ref()
    b[1] *= 2.0**-40  # a tiny row next to unit rows
    broken = b.clone()
    broken[1] *= 1.5  # planted: the tiny row is wrong; a whole-tensor atol would not see it
    assert not compare.elementwise(broken, b, TOL_BF16)["passed"]


def test_rule1_nan_and_inf_handling():
    b = _ref()
    b[0, 0], b[0, 1] = float("inf"), float("nan")
    assert compare.elementwise(b.clone(), b, TOL_BF16)["passed"]
    broken = b.clone()
    broken[0, 2] = float("nan")
    assert not compare.elementwise(broken, b, TOL_BF16)["passed"]


def test_arbitration_accepts_error_near_the_floor_and_rejects_large_excess():
    truth = _ref()
    floor = truth.bfloat16().double()
    near = truth + 2 * (floor - truth)  # twice the ideal error
    assert compare.arbitrate(near, truth, floor, TOL_BF16.arbitration_factor)["passed"]
    far = truth + 4 * TOL_BF16.arbitration_factor * (floor - truth)  # planted: K-fold excess x 4
    assert not compare.arbitrate(far, truth, floor, TOL_BF16.arbitration_factor)["passed"]


def _probs(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_routing_set_accepts_either_side_of_an_exact_tie():
    probs = _probs([[0.4, 0.2, 0.2, 0.1, 0.1]])
    for chosen in ([0, 1], [0, 2], [2, 0]):  # order and tie resolution are free
        assert compare.routing_set(torch.tensor([chosen]), probs, 2, TOL_ROUTING)["passed"]


def test_routing_set_accepts_a_near_tie_within_tolerance():
    eps = TOL_ROUTING.tau * 0.1
    probs = _probs([[0.4, 0.2 + eps, 0.2, 0.1, 0.1 - eps]])
    stats = compare.routing_set(torch.tensor([[0, 2]]), probs, 2, TOL_ROUTING)
    assert stats["passed"] and stats["ties_resolved_differently"] == 1


def test_routing_set_rejects_a_clearly_worse_expert_and_duplicates():
    probs = _probs([[0.4, 0.3, 0.2, 0.1]])
    assert not compare.routing_set(torch.tensor([[0, 2]]), probs, 2, TOL_ROUTING)["passed"]  # planted: skips 0.3
    assert not compare.routing_set(torch.tensor([[0, 0]]), probs, 2, TOL_ROUTING)["passed"]  # planted: duplicate
    assert not compare.routing_set(torch.tensor([[0, 7]]), probs, 2, TOL_ROUTING)["passed"]  # planted: out of range

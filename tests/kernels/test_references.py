"""The float64 references: gradcheck each, and cross-check each against an independent
formulation (a second opinion from the math, so a reference bug cannot hide)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.kernels.checks import references
from harness.kernels.checks.registry import OPS
from harness.kernels.ops.cross_entropy_torch import IGNORE_INDEX
from harness.registry.tolerances import FLOAT64_AGREEMENT as AGREE


def _inputs(op):
    case = op.gradcheck_case
    master = case.build(torch.Generator().manual_seed(case.seed(op.name)))
    return master, dict(case.params)


@pytest.mark.parametrize("op_name", list(OPS))
def test_reference_gradcheck_float64(op_name):
    op = OPS[op_name]
    master, params = _inputs(op)
    if op.pin is not None:  # pin the discrete choice so gradcheck's perturbations cannot flip it
        params.update(op.pin(op.reference(**master, **params)))
    diff = list(op.diff_inputs)

    def fn(*tensors):
        inputs = dict(master)
        inputs.update(zip(diff, tensors, strict=True))
        outputs = op.reference(**inputs, **params)
        return tuple(outputs[name] for name in op.diff_outputs)

    leaves = tuple(master[name].clone().requires_grad_(True) for name in diff)
    assert all(t.dtype == torch.float64 for t in leaves)
    assert torch.autograd.gradcheck(fn, leaves)


def _master(op_name, case_name):
    op = OPS[op_name]
    case = op.case(case_name)
    return case.build(torch.Generator().manual_seed(case.seed(op.name))), dict(case.params)


def test_rope_reference_is_a_rotation_of_each_pair():
    inputs, params = _master("rotary_embedding", "qwen3_4b_kv_packed")
    x, positions = inputs["x"], inputs["positions"]
    y = references.rotary_embedding(x, positions, **params)["y"]
    half = x.shape[-1] // 2
    def pair_norm(t):
        return t[..., :half] ** 2 + t[..., half:] ** 2

    torch.testing.assert_close(pair_norm(y), pair_norm(x), **AGREE)
    # Second opinion: complex multiplication by exp(i * angle) on (x_i, x_{i+D/2}) pairs.
    dim = x.shape[-1]
    angle = positions[..., None].double() * params["theta"] ** (-torch.arange(half, dtype=torch.float64) * 2 / dim)
    z = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angle), angle)[:, :, None, :]
    torch.testing.assert_close(y, torch.cat((z.real, z.imag), dim=-1), **AGREE)


def test_rmsnorm_reference_matches_torch_rms_norm_in_float64():
    inputs, params = _master("rms_norm", "qwen3_4b_hidden")
    y = references.rms_norm(inputs["x"], inputs["weight"], **params)["y"]
    expected = F.rms_norm(inputs["x"], (inputs["x"].shape[-1],), inputs["weight"], eps=params["eps"])
    torch.testing.assert_close(y, expected, **AGREE)


def test_router_reference_weights_sum_to_one_and_follow_softmax_order():
    inputs, params = _master("moe_router", "qwen3_30b_a3b")
    out = references.moe_router(inputs["x"], inputs["gate_weight"], **params)
    torch.testing.assert_close(out["weights"].sum(-1), torch.ones(out["weights"].shape[0], dtype=torch.float64),
                               **AGREE)
    logits = inputs["x"] @ inputs["gate_weight"].t()
    chosen_logits = logits.gather(1, out["ids"])
    # renormalised top-k softmax == softmax over the chosen logits only
    torch.testing.assert_close(out["weights"], torch.softmax(chosen_logits, dim=-1), **AGREE)
    assert bool((chosen_logits.min(1).values >= logits.topk(params["top_k"]).values.min(1).values).all())


def test_swiglu_reference_matches_a_dense_per_row_formulation():
    inputs, _ = _master("grouped_swiglu", "many_experts")
    y = references.grouped_swiglu(**inputs)["y"]
    counts = inputs["num_tokens_per_expert"]
    expert = torch.repeat_interleave(torch.arange(len(counts)), counts)
    x = inputs["x"]
    rows = [
        F.linear(F.silu(F.linear(x[r], inputs["w1"][e])) * F.linear(x[r], inputs["w3"][e]), inputs["w2"][e])
        for r, e in enumerate(expert.tolist())
    ]
    torch.testing.assert_close(y, torch.stack(rows), **AGREE)


def test_cross_entropy_reference_matches_torch_sum_reduction():
    inputs, _ = _master("cross_entropy", "small_vocab_batch")
    loss = references.cross_entropy(inputs["logits"], inputs["labels"])["loss"]
    expected = F.cross_entropy(
        inputs["logits"].flatten(0, 1), inputs["labels"].flatten(), reduction="sum", ignore_index=IGNORE_INDEX
    )
    torch.testing.assert_close(loss, expected, **AGREE)
    assert int((inputs["labels"] == IGNORE_INDEX).sum()) == 2 and math.isfinite(float(loss))

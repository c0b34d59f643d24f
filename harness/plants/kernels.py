"""Plants realised as broken kernel implementations (see harness/plants/__init__.py).

Each is an ``Implementation`` with one bug, declared with the cases and dtypes on which it must
be caught and the checks that must fail there. tests/kernels/test_checker_catches.py runs each
through the same ``run`` as the real implementations and asserts that it FAILS. This proves that
every kind of assertion the conformance tests make can fail: values, gradients, routing sets,
dtype contracts and arbitration.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.kernels.checks.spec import Implementation
from harness.kernels.ops import grouped_swiglu as gs
from harness.kernels.ops.nki.grouped_swiglu_kernel_torch import blocked_rows_torch_ref
from harness.kernels.ops.rope_torch import rope_cos_sin  # the one RoPE reference; the plant is in the rotation
from harness.plants import KernelPlant, Plant
from harness.references.loss import IGNORE_INDEX


def _plant(name, op, run, catch_on, failing_checks, description, output_dtypes=None) -> Plant:
    implementation = Implementation(name, "plant", f"planted defect {name}", ("cpu",), run, _f32,
                                    output_dtypes=output_dtypes)
    return Plant(name, "kernel", description, failing_checks,
                 kernel=KernelPlant(op, implementation, catch_on))


def _f32(dtype, device):
    return torch.promote_types(dtype, torch.float32)


# ---------------------------------------------------------------- RoPE


def _rope_angles(x, positions, theta):
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta, dtype=torch.float64)
    return cos.float()[:, :, None, :], sin.float()[:, :, None, :]


def _rope(swap_sign: bool = False, keep_float32: bool = False):
    def run(inputs, params, device):
        x = inputs["x"]
        cos, sin = _rope_angles(x, inputs["positions"], params["theta"])
        xf = x.float()
        half = x.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        rotated = torch.cat((x2, -x1), dim=-1) if swap_sign else torch.cat((-x2, x1), dim=-1)
        y = xf * cos + rotated * sin
        return {"y": y if keep_float32 else y.type_as(x)}

    return run


# ---------------------------------------------------------------- RMSNorm


def _rmsnorm_eps_outside_sqrt(inputs, params, device):
    x, weight = inputs["x"], inputs["weight"]
    xf = x.float()
    y = xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + params["eps"])
    return {"y": (y * weight.float()).type_as(x)}


# ---------------------------------------------------------------- router


def _router(renormalise: bool = True, skip_best: bool = False, detach: bool = False):
    def run(inputs, params, device):
        x, gate = inputs["x"], inputs["gate_weight"]
        logits = x.float() @ gate.float().t()
        probs = F.softmax(logits.detach() if detach else logits, dim=-1)
        k = params["top_k"]
        values, ids = torch.topk(probs, k + 1 if skip_best else k, dim=-1)
        if skip_best:
            values, ids = values[:, 1:], ids[:, 1:]
        if renormalise:
            values = values / values.sum(-1, keepdim=True)
        return {"weights": values, "ids": ids}

    return run


# ---------------------------------------------------------------- grouped SwiGLU


def _swiglu_rows(inputs, shift: int = 0):
    counts = inputs["num_tokens_per_expert"].tolist()
    bounds, start = [], 0
    for count in counts:
        bounds.append((start, start + count))
        start += count
    if shift:
        bounds = [(max(lo + shift, 0), min(hi + shift, start)) if hi > lo else (lo, hi) for lo, hi in bounds]
    return bounds


def _swiglu(swap_w1_w3: bool = False, shift_offsets: int = 0):
    def run(inputs, params, device):
        x, w1, w2, w3 = (inputs[k].float() for k in ("x", "w1", "w2", "w3"))
        if swap_w1_w3:
            w1, w3 = w3, w1
        rows = [x[:0]] * x.shape[0]
        for e, (lo, hi) in enumerate(_swiglu_rows(inputs, shift_offsets)):
            part = x[lo:hi]
            out = (F.silu(part @ w1[e].t()) * (part @ w3[e].t())) @ w2[e].t()
            for i in range(hi - lo):
                rows[lo + i] = out[i : i + 1]
        y = torch.cat([r if r.shape[0] else x[i : i + 1] * 0 for i, r in enumerate(rows)], dim=0)
        return {"y": y.type_as(inputs["x"])}

    return run


class _SwigluSwappedWeightGrads(torch.autograd.Function):
    """Correct forward; backward returns dw3 where dw1 belongs and vice versa."""

    @staticmethod
    def forward(ctx, x, w1, w2, w3, counts):
        ctx.save_for_backward(x, w1, w2, w3)
        ctx.counts = counts
        return _swiglu()({"x": x, "w1": w1, "w2": w2, "w3": w3, "num_tokens_per_expert": counts}, {}, "cpu")["y"]

    @staticmethod
    def backward(ctx, grad):
        x, w1, w2, w3 = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            y = _swiglu()({"x": x, "w1": w1, "w2": w2, "w3": w3, "num_tokens_per_expert": ctx.counts}, {}, "cpu")["y"]
            dx, dw1, dw2, dw3 = torch.autograd.grad(y, (x, w1, w2, w3), grad)
        return dx, dw3, dw2, dw1, None


def _swiglu_swapped_weight_grads(inputs, params, device):
    args = (inputs["x"], inputs["w1"], inputs["w2"], inputs["w3"], inputs["num_tokens_per_expert"])
    return {"y": _SwigluSwappedWeightGrads.apply(*args)}


# ---------------------------------------------------------------- grouped SwiGLU, blockwise layout
# (harness/kernels/ops/grouped_swiglu.py block -> body -> unblock, the NKI kernel's torch twin as the body)


def _blockwise_swiglu(next_expert: bool = False, blocks_computed=None):
    """The blockwise path in float32 with one defect in what the kernel body is given:
    ``next_expert``: block ``n`` computed with expert ``block_expert[n] + 1`` (a wrong
    block -> expert map); ``blocks_computed(R, E, B)``: the kernel's static block loop stops
    there (blocks past it never computed, their rows left zero)."""
    def run(inputs, params, device):
        x, w1, w2, w3 = (inputs[k].float() for k in ("x", "w1", "w2", "w3"))
        offsets = torch.cumsum(inputs["num_tokens_per_expert"], 0, dtype=torch.int32)
        experts = w1.shape[0]

        def body(x_blocked, block_expert, w1_, w2_, w3_):
            ids = (block_expert + 1) % experts if next_expert else block_expert
            y_blocked = blocked_rows_torch_ref(x_blocked, ids, w1_, w2_, w3_)
            if blocks_computed is not None:
                kept = blocks_computed(x.shape[0], experts, gs.BLOCK_SIZE) * gs.BLOCK_SIZE
                y_blocked = torch.cat((y_blocked[:kept], torch.zeros_like(y_blocked[kept:])))
            return y_blocked

        return {"y": gs.grouped_swiglu_blockwise(x, offsets, w1, w2, w3, body).type_as(inputs["x"])}

    return run


BLOCKWISE_SWIGLU_PLANTS = (
    _plant("swiglu_blocks_take_the_next_expert", "grouped_swiglu", _blockwise_swiglu(next_expert=True),
           (("many_experts", torch.float32), ("many_experts", torch.bfloat16)), ("y",),
           "blockwise layout: block n computed with expert block_expert[n] + 1 (wrong block -> expert map)"),
    _plant("swiglu_block_count_without_expert_tails", "grouped_swiglu",
           _blockwise_swiglu(blocks_computed=lambda rows, experts, block: -(-rows // block)),
           (("many_experts", torch.float32), ("empty_first_last", torch.float32)), ("y",),
           "blockwise layout: the static block loop runs ceil(R/B) blocks, forgetting that each expert's "
           "last block may be partial (max_blocks is min(E,R) + (R - min(E,R)) // B)"),
)


# ---------------------------------------------------------------- cross-entropy


def _ce(shift_labels: bool = False, mean: bool = False):
    def run(inputs, params, device):
        logits, labels = inputs["logits"].float(), inputs["labels"]
        if shift_labels:  # the causal shift applied again to labels that are already aligned
            logits, labels = logits[:, :-1], labels[:, 1:]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX,
            reduction="mean" if mean else "sum",
        )
        return {"loss": loss}

    return run


BF16, F32 = torch.bfloat16, torch.float32

KERNEL_PLANTS = (
    _plant("rope_wrong_half_swap_sign", "rotary_embedding", _rope(swap_sign=True),
           (("qwen3_4b_q", F32), ("qwen3_4b_q", BF16)), ("y", "grad_x"),
           "rotate_half returns [x2, -x1] instead of [-x2, x1]"),
    _plant("rope_forgets_type_as", "rotary_embedding", _rope(keep_float32=True),
           (("qwen3_4b_q", BF16),), ("dtype:y",), "returns the float32 result for a bfloat16 input",
           output_dtypes=lambda d, dev: {"y": d}),
    _plant("rmsnorm_eps_outside_sqrt", "rms_norm", _rmsnorm_eps_outside_sqrt,
           (("bf16_extremes", F32), ("bf16_extremes", BF16)), ("y",),
           "x / (sqrt(mean(x^2)) + eps) instead of x / sqrt(mean(x^2) + eps)"),
    _plant("router_without_renormalisation", "moe_router", _router(renormalise=False),
           (("qwen3_30b_a3b", F32), ("qwen3_30b_a3b", BF16)), ("weights",),
           "top-k probabilities not renormalised"),
    _plant("router_skips_best_expert", "moe_router", _router(skip_best=True),
           (("qwen3_30b_64e_top4", F32), ("exact_ties", F32)), ("routing:ids",),
           "takes ranks 2..k+1 instead of 1..k"),
    _plant("router_detached_logits", "moe_router", _router(detach=True),
           (("qwen3_30b_a3b", F32),), ("grad_x", "grad_gate_weight"),
           "softmax of detached logits: no gradient reaches the gate"),
    _plant("swiglu_w1_w3_swapped", "grouped_swiglu", _swiglu(swap_w1_w3=True),
           (("many_experts", F32), ("many_experts", BF16)), ("y",),
           "silu(x w3^T) * (x w1^T): gate and up projections swapped"),
    _plant("swiglu_offsets_off_by_one", "grouped_swiglu", _swiglu(shift_offsets=1),
           (("empty_first_last", F32),), ("y",), "expert row ranges shifted by one row"),
    _plant("swiglu_backward_swaps_w1_w3_grads", "grouped_swiglu", _swiglu_swapped_weight_grads,
           (("many_experts", F32),), ("grad_w1", "grad_w3"),
           "correct forward; backward returns dw3 for w1 and dw1 for w3"),
    _plant("ce_label_shift_off_by_one", "cross_entropy", _ce(shift_labels=True),
           (("small_vocab_batch", F32), ("small_vocab_batch", BF16)), ("loss",),
           "shifts already-aligned labels by one position"),
    _plant("ce_mean_instead_of_sum", "cross_entropy", _ce(mean=True),
           (("small_vocab_batch", F32),), ("loss", "grad_logits"),
           "mean reduction where the trainer expects a sum"),
    *BLOCKWISE_SWIGLU_PLANTS,
)

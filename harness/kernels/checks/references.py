"""The kernel registry's op-level references: each op's math in the registry's calling
convention (the op's inputs and parameters by name, a dict of its named outputs).

The math is not written here: it has one home per op beside the kernels, nki-library's
``X.py`` / ``X_torch.py`` (harness/kernels/ops/rope_torch.py, grouped_swiglu_torch.py, and for the ops
with no kernel of the harness's own rms_norm_torch.py, moe_router_torch.py,
cross_entropy_torch.py), where the model reference (harness/references/model.py) builds on it
too. Rules: no torchtitan / transformers import; every function computes in the dtype of its
floating inputs (call it with float64 tensors for the float64 truth; ``gradcheck`` runs on
them); autograd is torch's, so the references carry no hand-written backward to get wrong.
"""

from __future__ import annotations

from torch import Tensor

from harness.kernels.ops import grouped_swiglu_torch, moe_router_torch, rms_norm_torch, rope_torch
from harness.kernels.ops.cross_entropy_torch import IGNORE_INDEX, summed_cross_entropy


def rotary_embedding(x: Tensor, positions: Tensor, *, theta: float) -> dict[str, Tensor]:
    """RoPE of ``x (B, S, H, D)`` at ``positions (B|1, S)`` int, entirely in ``x``'s dtype."""
    cos, sin = rope_torch.rope_cos_sin(positions, x.shape[-1], theta, dtype=x.dtype)
    return {"y": rope_torch.apply_rope(x, cos, sin)}


def rms_norm(x: Tensor, weight: Tensor, *, eps: float) -> dict[str, Tensor]:
    return {"y": rms_norm_torch.rms_norm(x, weight, eps)}


def moe_router(x: Tensor, gate_weight: Tensor, *, top_k: int, ids: Tensor | None = None) -> dict[str, Tensor]:
    """``x`` (T, D), ``gate_weight`` (E, D); the k weights renormalised to sum to one. ``ids``
    pins the selected experts (T, K): the reference evaluated on the set an implementation chose
    where probabilities tie. ``probs`` (T, E) is the full distribution."""
    weights, ids, probs = moe_router_torch.route(x, gate_weight, top_k, ids=ids)
    return {"weights": weights, "ids": ids, "probs": probs}


def grouped_swiglu(x: Tensor, num_tokens_per_expert: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> dict[str, Tensor]:
    """Rows of ``x`` (R, D) sorted by expert: expert ``e`` owns the next
    ``num_tokens_per_expert[e]`` rows. Rows owned by no expert are zero."""
    return {"y": grouped_swiglu_torch.grouped_swiglu_rows(x, num_tokens_per_expert.tolist(), w1, w2, w3)}


def cross_entropy(logits: Tensor, labels: Tensor, *, ignore_index: int = IGNORE_INDEX) -> dict[str, Tensor]:
    """Summed token cross entropy of ``labels`` (B, L) under ``logits`` (B, L, V), already
    aligned (no shift); ``ignore_index`` labels contribute nothing."""
    return {"loss": summed_cross_entropy(logits, labels, ignore_index)}

"""Reference implementations written from the math, in plain torch.

Rules: no torchtitan / transformers import; every function computes in the dtype of its
floating inputs (call it with float64 tensors for the float64 truth; ``gradcheck`` runs on
them); autograd is torch's, so the references carry no hand-written backward to get wrong.

Each returns a dict of named outputs; the names are the op's output names in the registry.
"""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE_INDEX = -100


def rotary_embedding(x: Tensor, positions: Tensor, *, theta: float) -> dict[str, Tensor]:
    """Rotate-half RoPE. ``x`` (B, S, H, D), ``positions`` (B|1, S) int.

    For pair ``i < D/2`` the angle is ``p * theta**(-2i/D)``; dims ``i`` and ``i + D/2`` rotate
    together: ``y_i = x_i cos - x_{i+D/2} sin``, ``y_{i+D/2} = x_{i+D/2} cos + x_i sin``.
    """
    dim = x.shape[-1]
    half = dim // 2
    exponent = torch.arange(half, dtype=x.dtype, device=x.device) * (2.0 / dim)
    inv_freq = torch.pow(torch.as_tensor(theta, dtype=x.dtype, device=x.device), -exponent)
    angle = positions.to(x.dtype)[..., None] * inv_freq  # (B|1, S, D/2)
    cos = torch.cos(angle)[:, :, None, :]
    sin = torch.sin(angle)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    y = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return {"y": y}


def rms_norm(x: Tensor, weight: Tensor, *, eps: float) -> dict[str, Tensor]:
    """``y = x / sqrt(mean(x^2 over the last dim) + eps) * weight``."""
    mean_square = (x * x).mean(dim=-1, keepdim=True)
    return {"y": x / torch.sqrt(mean_square + eps) * weight}


def moe_router(x: Tensor, gate_weight: Tensor, *, top_k: int, ids: Tensor | None = None) -> dict[str, Tensor]:
    """Softmax over experts, top-k, renormalise the k probabilities to sum to one.

    ``x`` (T, D), ``gate_weight`` (E, D). ``ids`` pins the selected experts (T, K) -- used to
    evaluate the reference on the set an implementation chose when probabilities tie; the
    returned ``weights`` are in ``ids``' order. ``probs`` (T, E) is the full distribution.
    """
    logits = x @ gate_weight.transpose(0, 1)
    probs = torch.softmax(logits, dim=-1)
    if ids is None:
        ids = torch.topk(probs, k=top_k, dim=-1).indices
    chosen = probs.gather(-1, ids)
    return {"weights": chosen / chosen.sum(dim=-1, keepdim=True), "ids": ids, "probs": probs}


def grouped_swiglu(x: Tensor, num_tokens_per_expert: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> dict[str, Tensor]:
    """Rows of ``x`` (R, D) are sorted by expert; expert ``e`` owns the next
    ``num_tokens_per_expert[e]`` rows: ``y = (silu(x w1_e^T) * (x w3_e^T)) w2_e^T``.
    Rows owned by no expert are zero."""
    outputs = []
    start = 0
    for e, count in enumerate(num_tokens_per_expert.tolist()):
        rows = x[start : start + count]
        gate = rows @ w1[e].transpose(0, 1)
        up = rows @ w3[e].transpose(0, 1)
        hidden = gate * torch.sigmoid(gate) * up
        outputs.append(hidden @ w2[e].transpose(0, 1))
        start += count
    outputs.append(x[start:] * 0)
    return {"y": torch.cat(outputs, dim=0)}


def cross_entropy(logits: Tensor, labels: Tensor, *, ignore_index: int = IGNORE_INDEX) -> dict[str, Tensor]:
    """Summed negative log-likelihood of ``labels`` (B, L) under ``logits`` (B, L, V); labels
    equal to ``ignore_index`` contribute nothing. Labels are already aligned with logits
    (position t predicts labels[t]); no shift happens here."""
    flat = logits.reshape(-1, logits.shape[-1])
    target = labels.reshape(-1)
    keep = target != ignore_index
    log_z = torch.logsumexp(flat[keep], dim=-1)
    picked = flat[keep].gather(-1, target[keep][:, None]).squeeze(-1)
    return {"loss": (log_z - picked).sum()}

"""Reference implementations written from the math, in plain torch.

Rules: no torchtitan / transformers import; every function computes in the dtype of its
floating inputs (call it with float64 tensors for the float64 truth; ``gradcheck`` runs on
them); autograd is torch's, so the references carry no hand-written backward to get wrong.

Each returns a dict of named outputs; the names are the op's output names in the registry.

References of ops the harness itself implements live beside their kernel (nki-library's
``X.py`` / ``X_torch.py``) and are re-exported here: RoPE from ``harness.ops.rope_torch`` (the
repository's one RoPE reference), the grouped SwiGLU from ``harness.ops.grouped_swiglu_torch``.
The others are references of upstream kernels only and are written here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.ops.grouped_swiglu_torch import grouped_swiglu  # noqa: F401  (re-export)
from harness.ops.rope_torch import rotary_embedding  # noqa: F401  (re-export)

IGNORE_INDEX = -100


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

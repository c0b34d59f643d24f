"""Torch reference of ``harness/ops/grouped_swiglu.py`` (``grouped_swiglu_torch_ref`` has the
custom op's signature) and the kernel registry's op-level reference (``grouped_swiglu``).

Exact math in the dtype it is given (float64 for the truth; ``gradcheck`` runs on it), no
bfloat16 policy: torchtitan's rounding points are the implementation's, declared in the
registry as its compute dtype. Rows owned by no expert are zero.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _swiglu_rows(rows: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    gate = rows @ w1.transpose(0, 1)
    up = rows @ w3.transpose(0, 1)
    return (gate * torch.sigmoid(gate) * up) @ w2.transpose(0, 1)


def _grouped(x: Tensor, counts: list[int], w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    outputs, start = [], 0
    for e, count in enumerate(counts):
        outputs.append(_swiglu_rows(x[start : start + count], w1[e], w2[e], w3[e]))
        start += count
    outputs.append(x[start:] * 0)
    return torch.cat(outputs, dim=0)


def grouped_swiglu_torch_ref(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """Twin of ``harness::grouped_swiglu``: expert ``e`` owns rows ``offsets[e-1]:offsets[e]``
    of ``x_RD``; ``y = (silu(x w1_e^T) * (x w3_e^T)) w2_e^T``, in ``x``'s dtype."""
    bounds = [0] + [int(v) for v in offsets.tolist()]
    counts = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
    return _grouped(x, counts, w1, w2, w3)


def grouped_swiglu(x: Tensor, num_tokens_per_expert: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> dict[str, Tensor]:
    """Registry reference: rows of ``x`` (R, D) are sorted by expert; expert ``e`` owns the next
    ``num_tokens_per_expert[e]`` rows. Rows owned by no expert are zero."""
    return {"y": _grouped(x, num_tokens_per_expert.tolist(), w1, w2, w3)}

"""The repository's one SwiGLU reference, in torch: the MLP of one expert (or of a dense layer),
and the grouped form of ``harness/kernels/ops/grouped_swiglu.py`` built on it.

``swiglu``: ``y = (silu(x w_gate^T) * (x w_up^T)) w_down^T``, in ``x``'s dtype; ``dtype`` makes
the three matmuls (and the product between them) take ``dtype`` operands and return ``dtype``
results, cast back to ``x``'s dtype at the end: torchtitan's ``GroupedExperts`` with
``dtype=bfloat16``, the precision the model reference (harness/references/model.py) emulates its
experts in.

``grouped_swiglu_torch_ref`` is the torch twin of the custom op (its signature): expert ``e``
owns rows ``offsets[e-1]:offsets[e]`` and applies ``swiglu`` with its weights ``w1[e]`` (gate),
``w3[e]`` (up), ``w2[e]`` (down); rows owned by no expert are zero. ``grouped_swiglu_rows`` is
the same by row counts (the kernel registry's form, harness/kernels/checks/references.py).

Exact math in the dtype it is given (float64 for the truth; ``gradcheck`` runs on it), no
bfloat16 policy of its own: torchtitan's rounding points are the implementation's, declared in
the registry as its compute dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, *,
           dtype: torch.dtype | None = None) -> Tensor:
    """One SwiGLU MLP on the rows of ``x``; with ``dtype``, its matmuls in that precision."""
    if dtype is None:
        return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)
    xd = x.to(dtype)
    h = F.silu(xd @ w_gate.to(dtype).T) * (xd @ w_up.to(dtype).T)
    return (h @ w_down.to(dtype).T).to(x.dtype)


def grouped_swiglu_rows(x: Tensor, counts: list[int], w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """Rows of ``x`` sorted by expert: expert ``e`` owns the next ``counts[e]`` rows."""
    outputs, start = [], 0
    for e, count in enumerate(counts):
        outputs.append(swiglu(x[start : start + count], w1[e], w3[e], w2[e]))
        start += count
    outputs.append(x[start:] * 0)
    return torch.cat(outputs, dim=0)


def grouped_swiglu_torch_ref(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """Twin of ``harness::grouped_swiglu``: expert ``e`` owns rows ``offsets[e-1]:offsets[e]``
    of ``x_RD``; ``y = (silu(x w1_e^T) * (x w3_e^T)) w2_e^T``, in ``x``'s dtype."""
    bounds = [0] + [int(v) for v in offsets.tolist()]
    counts = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
    return grouped_swiglu_rows(x, counts, w1, w2, w3)

"""Torch twin of ``grouped_swiglu_kernel.grouped_swiglu_kernel``: same arguments, capacity-padded
feature-major layout and rounding points.

Computes in ``xT``'s dtype: each GEMM accumulates in ``promote(dtype, float32)`` and is rounded
to ``dtype`` where the kernel rounds (bfloat16 for the kernel's bfloat16 arguments; float64
throughout when given float64). Columns ``e*C .. (e+1)*C`` belong to expert ``e``, with
``C = xT.shape[1] // E``; zero padding columns give zero outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def grouped_swiglu_kernel_torch_ref(xT: Tensor, w1T: Tensor, w3T: Tensor, w2T: Tensor) -> Tensor:
    dtype = xT.dtype
    acc = torch.promote_types(dtype, torch.float32)
    experts = w1T.shape[0]
    capacity = xT.shape[1] // experts if experts else 0
    yT = torch.zeros(w2T.shape[-1], xT.shape[1], dtype=dtype)
    for e in range(experts):
        cols = slice(e * capacity, (e + 1) * capacity)
        x_e = xT[:, cols].to(acc)
        a = (w1T[e].t().to(acc) @ x_e).to(dtype)
        b = (w3T[e].t().to(acc) @ x_e).to(dtype)
        h = F.silu(a) * b
        yT[:, cols] = (w2T[e].t().to(acc) @ h.to(acc)).to(dtype)
    return yT

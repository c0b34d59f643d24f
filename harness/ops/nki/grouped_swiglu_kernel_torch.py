"""Torch twin of ``grouped_swiglu_kernel.grouped_swiglu_kernel``: same arguments, the same
blockwise feature-major layout (block ``n`` = columns ``n*B .. (n+1)*B`` of ``xT``, computed with
expert ``block_expert[n]``), the same rounding points.

Computes in ``xT``'s dtype: each GEMM accumulates in ``promote(dtype, float32)`` and is rounded
to ``dtype`` where the kernel rounds (bfloat16 for the kernel's bfloat16 arguments; float64
throughout when given float64). Zero padding columns give zero outputs. A block whose expert
id is not in ``0 .. E-1`` raises, as the kernel's weight DMA does (``oob_mode.error``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def grouped_swiglu_kernel_torch_ref(xT: Tensor, block_expert: Tensor, w1T: Tensor, w3T: Tensor, w2T: Tensor) -> Tensor:
    dtype = xT.dtype
    acc = torch.promote_types(dtype, torch.float32)
    experts = w1T.shape[0]
    ids = [int(v) for v in block_expert.reshape(-1).tolist()]
    block = xT.shape[1] // len(ids) if ids else 0
    if block * len(ids) != xT.shape[1]:
        raise ValueError(f"xT has {xT.shape[1]} columns, not a multiple of the {len(ids)} blocks of block_expert")
    yT = torch.zeros(w2T.shape[-1], xT.shape[1], dtype=dtype)
    for n, e in enumerate(ids):
        if not 0 <= e < experts:
            raise IndexError(f"block_expert[{n}] = {e} is not an expert index 0..{experts - 1}")
        cols = slice(n * block, (n + 1) * block)
        x_n = xT[:, cols].to(acc)
        a = (w1T[e].t().to(acc) @ x_n).to(dtype)
        b = (w3T[e].t().to(acc) @ x_n).to(dtype)
        h = F.silu(a) * b
        yT[:, cols] = (w2T[e].t().to(acc) @ h.to(acc)).to(dtype)
    return yT

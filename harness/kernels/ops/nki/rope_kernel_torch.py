"""Torch twin of ``rope_kernel.rope_halves_kernel``: same arguments, layout and dtype policy,
computed by the one RoPE reference (``harness.kernels.ops.rope_torch``).

Six ``[D/2, N]`` arrays in, ``(o1, o2)`` out in ``x1``'s dtype; the rotation is computed in the
promotion of the input dtypes (float32 for the kernel's bf16/f32 inputs with float32 cos/sin;
float64 when given float64).
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.kernels.ops.rope_torch import rope_torch_ref


def rope_halves_kernel_torch_ref(x1: Tensor, x2: Tensor, c1: Tensor, c2: Tensor, s1: Tensor, s2: Tensor):
    half, n = x1.shape

    def whole(a: Tensor, b: Tensor) -> Tensor:  # [D/2, N] halves -> (1, N, 1, D)
        return torch.cat((a.t(), b.t()), dim=-1).reshape(1, n, 1, 2 * half)

    y = rope_torch_ref(whole(x1, x2), whole(c1, c2), whole(s1, s2)).reshape(n, 2 * half)
    return y[:, :half].t().contiguous(), y[:, half:].t().contiguous()

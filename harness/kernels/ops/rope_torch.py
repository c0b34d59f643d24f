"""The repository's one RoPE reference (rotate-half, as Qwen3 in HF and torchtitan), in torch.

Torch twin of ``harness/kernels/ops/rope.py`` (``rope_torch_ref`` has the custom op's signature) and
the math of the kernel registry's op-level reference (harness/kernels/checks/references.py
``rotary_embedding``). Everything computes in the dtype it is given (float64 for the truth;
``gradcheck`` runs on it), with no torchtitan or transformers import. Other code that needs
RoPE imports it from here::

    from harness.kernels.ops.rope_torch import rope_inv_freq, rope_cos_sin, apply_rope

The math: for pair ``i < D/2`` the angle is ``p * theta**(-2i/D)``; dims ``i`` and ``i + D/2``
rotate together: ``y_i = x_i cos - x_{i+D/2} sin``, ``y_{i+D/2} = x_{i+D/2} cos + x_i sin``.

``rope_inv_freq`` / ``rope_cos_sin`` use torchtitan's expression (``1 / theta**(arange(0, D, 2)
/ D)``, positions times inverse frequencies, halves repeated), so with ``dtype=float32`` they are
bitwise torchtitan's ``CosSinRoPE`` cache (tests/kernels/test_twins.py); with float64 they
are the truth.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rope_inv_freq(head_dim: int, theta: float, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """``theta ** (-2i / head_dim)`` for ``i < head_dim/2``, computed in ``dtype``."""
    exponent = torch.arange(0, head_dim, 2, dtype=dtype)[: head_dim // 2] / head_dim
    return 1.0 / (theta**exponent)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, *, dtype: torch.dtype = torch.float64):
    """``(cos, sin)`` of shape ``positions.shape + (head_dim,)``, rotate-half layout (the
    ``head_dim/2`` angles repeated), computed in ``dtype``."""
    angles = positions.to(dtype)[..., None] * rope_inv_freq(head_dim, theta, dtype=dtype)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _rotate_half(v: Tensor) -> Tensor:
    half = v.shape[-1] // 2
    return torch.cat((-v[..., half:], v[..., :half]), dim=-1)


def _heads_view(t: Tensor, x: Tensor) -> Tensor:
    """cos/sin ``(S, D)``, ``(B|1, S, D)`` or ``(B|1, S, 1, D)`` -> ``(B|1, S, 1, D)`` for ``x (B, S, H, D)``."""
    if t.dim() == 2:
        return t[None, :, None, :]
    if t.dim() == 3:
        return t[:, :, None, :]
    if t.dim() == 4:
        return t
    raise ValueError(f"cos/sin must be (S, D), (B, S, D) or (B, S, 1, D); got {tuple(t.shape)}")


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x (B, S, H, D)`` by ``cos``/``sin`` (see ``_heads_view`` for their shapes), in the
    promotion of the three dtypes; no cast back."""
    compute = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)
    xc = x.to(compute)
    return xc * _heads_view(cos, x).to(compute) + _rotate_half(xc) * _heads_view(sin, x).to(compute)


def rope_torch_ref(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Twin of ``harness::rope(x, cos, sin)``: the rotation, returned in ``x``'s dtype."""
    return apply_rope(x, cos, sin).to(x.dtype)

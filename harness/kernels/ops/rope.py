"""``harness::rope``: rotate-half rotary embedding of one tensor.

Semantics are exactly ``torchtitan.models.common.rope.CosSinRoPE.apply_rotary_emb`` applied
to one tensor::

    x_f = x.float()
    y   = (x_f * cos + rotate_half(x_f) * sin).type_as(x)      rotate_half(v) = [-v2, v1]

with ``cos``/``sin`` broadcast over heads. Computation is float32 (or the promotion of float32
with the cos/sin dtype, as in torchtitan: a float64 cache computes in float64, which is what
makes ``gradcheck`` possible), and the result has ``x``'s dtype.

One deliberate difference: torchtitan's ``x.float()`` would *down*-cast a float64 ``x`` to
float32; here ``x`` is only ever up-cast (``compute = promote(x.dtype, float32, cos, sin)``),
so a float64 call computes in float64. For bfloat16/float16/float32 ``x`` the two are the
same expression.

Shapes: ``x`` is ``(B, S, H, D)``; ``cos``/``sin`` are ``(S, D)``, ``(B|1, S, D)`` or
``(B|1, S, 1, D)`` (the last is torchtitan's reshaped cache slice).

Backward. ``y = x*c + R(x)*s`` is linear in ``x`` with ``R(v) = [-v2, v1]``, whose adjoint
is ``R^T(g) = [g2, -g1] = -R(g)``. So ``dx = g*c + R^T(g*s)``. The often-quoted shortcut
"the backward of RoPE is RoPE with -sin", ``dx = g*c + R(g)*(-s)``, equals this only when
``sin``'s two halves are equal (``s1 == s2``), which holds for every CosSinRoPE cache
(``theta = cat[freqs, freqs]``) but not for an arbitrary ``sin``; the exact adjoint is used
here so ``gradcheck`` with free ``cos``/``sin`` passes (tests/kernels/test_custom_ops.py has
the planted defect showing the shortcut fails it). Gradients for ``cos``/``sin`` are given
too (``sum over broadcast dims of g*x`` and ``g*R(x)``), although torchtitan's cache is a
buffer without grad.

Numerics versus torchtitan's autograd: identical expressions, so forward and backward are
bitwise equal (checked in tests/kernels/test_custom_ops.py).
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotate_half(v: Tensor) -> Tensor:
    half = v.shape[-1] // 2
    return torch.cat((-v[..., half:], v[..., :half]), dim=-1)


def rotate_half_adjoint(g: Tensor) -> Tensor:
    half = g.shape[-1] // 2
    return torch.cat((g[..., half:], -g[..., :half]), dim=-1)


def broadcast_cos_sin(t: Tensor, x: Tensor) -> Tensor:
    """View ``cos``/``sin`` as ``(B|1, S, 1, D)`` to broadcast against ``x`` ``(B, S, H, D)``."""
    if t.dim() == 2:
        t = t[None, :, None, :]
    elif t.dim() == 3:
        t = t[:, :, None, :]
    elif t.dim() != 4:
        raise ValueError(f"cos/sin must be (S, D), (B, S, D) or (B, S, 1, D); got {tuple(t.shape)}")
    if t.shape[-1] != x.shape[-1] or t.shape[1] != x.shape[1] or t.shape[2] != 1:
        raise ValueError(f"cos/sin shape {tuple(t.shape)} does not broadcast to x {tuple(x.shape)}")
    if t.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"cos/sin batch {t.shape[0]} does not broadcast to x batch {x.shape[0]}")
    return t


def _check(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    if x.dim() != 4:
        raise ValueError(f"x must be (B, S, H, D); got {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(f"head_dim must be even; got {x.shape[-1]}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ in shape")


def rope_math(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The op's math in plain torch (used by the CPU/CUDA kernel)."""
    c = broadcast_cos_sin(cos, x)
    s = broadcast_cos_sin(sin, x)
    x_f = x.to(torch.promote_types(x.dtype, torch.float32))
    return ((x_f * c) + (rotate_half(x_f) * s)).type_as(x).contiguous()


@torch.library.custom_op("harness::rope", mutates_args=(), device_types=("cpu", "cuda"))
def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE of ``x`` (B, S, H, D); see the module docstring."""
    _check(x, cos, sin)
    return rope_math(x, cos, sin)


@rope.register_fake
def _rope_fake(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    _check(x, cos, sin)
    broadcast_cos_sin(cos, x)
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, cos, sin = inputs
    need_x = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
    ctx.save_for_backward(x if need_x else None, cos, sin)
    ctx.x_dtype = x.dtype


def rope_backward_math(ctx_needs, x, cos, sin, grad, x_dtype):
    """(dx, dcos, dsin) for ``y = x*c + R(x)*s`` computed as torchtitan's autograd would."""
    grad_x = grad_cos = grad_sin = None
    c = broadcast_cos_sin(cos, grad)
    s = broadcast_cos_sin(sin, grad)
    compute = torch.promote_types(torch.promote_types(x_dtype, torch.float32), cos.dtype)
    g_f = grad.to(torch.promote_types(compute, sin.dtype))
    if ctx_needs[0]:
        grad_x = ((g_f * c) + rotate_half_adjoint(g_f * s)).to(x_dtype)
    if ctx_needs[1] or ctx_needs[2]:
        x_f = x.to(torch.promote_types(x.dtype, torch.float32))
        if ctx_needs[1]:
            grad_cos = (g_f * x_f).sum_to_size(c.shape).reshape(cos.shape).to(cos.dtype)
        if ctx_needs[2]:
            grad_sin = (g_f * rotate_half(x_f)).sum_to_size(s.shape).reshape(sin.shape).to(sin.dtype)
    return grad_x, grad_cos, grad_sin


def _backward(ctx, grad: Tensor):
    x, cos, sin = ctx.saved_tensors
    return rope_backward_math(ctx.needs_input_grad, x, cos, sin, grad, ctx.x_dtype)


rope.register_autograd(_backward, setup_context=_setup_context)

"""``harness::grouped_swiglu``: the routed-expert SwiGLU MLP of torchtitan's ``GroupedExperts``.

Forward, per expert ``e`` owning rows ``offsets[e-1]:offsets[e]`` of ``x_RD``::

    a = x_b @ w1_b[e].T          b = x_b @ w3_b[e].T          (x_b, w*_b: bfloat16 casts)
    h = silu(a) * b
    y = (h @ w2_b[e].T).type_as(x)

with torchtitan's dtype policy: all three grouped GEMMs take bfloat16 operands whatever the
input dtype (float32 accumulation inside the GEMM, bfloat16 result), ``silu`` and the product
are bfloat16 ops, and the result is cast to ``x``'s dtype. ``offsets`` is the int32 cumulative
sum of tokens per expert, as ``GroupedExperts.forward`` computes it.

CPU/CUDA kernel: ``torch._grouped_mm`` (the GEMM torchtitan calls) when every stride is a
multiple of 16 bytes (bfloat16: ``dim`` and ``hidden_dim`` multiples of 8); otherwise a loop
over experts with one ``mm`` each (bitwise equal to ``_grouped_mm`` on CPU in the tests).

Backward is written out (``setup_context`` saves inputs; ``a``/``b`` are recomputed — two
grouped GEMMs instead of keeping two ``(R, F)`` activations). Each step is the same op autograd
would run for torchtitan's forward (``_grouped_mm`` with the transposes of its derivative,
``aten.silu_backward``, casts back to each input's dtype, and the two ``x`` gradient terms
summed in ``x``'s dtype as autograd accumulates them), so on CPU forward and backward are
bitwise equal to torchtitan's (tests/kernels/test_custom_ops.py).

Documented differences from torchtitan:

* rows at or past ``offsets[-1]`` (not owned by any expert) are zero in ``y`` and in ``dx``;
  torchtitan's ``_grouped_mm`` leaves them uninitialised (observed: arbitrary values such as
  1.9e29 on CPU). The ``LocalTokenDispatcher`` never produces such rows.
* a stride-0 (expanded) incoming gradient is made contiguous first: ``torch._grouped_mm``'s
  CPU backward rejects it ("Invalid strides/sizes"), so ``GroupedExperts(...).sum().backward()``
  fails upstream on CPU while this op's backward does not.
* the ``GroupedExperts._grouped_mm`` override seam (MXFP8 converter) is not consulted.

The padded contract (every device). The forward runs as ``pad -> body -> unpad``
(``grouped_swiglu_padded``): expert ``e``'s rows are scattered to slots ``e*C .. e*C+count_e``
of a zero ``(E*C, D)`` buffer, the body computes every expert on its ``C`` slots, and the rows
are gathered back. The capacity ``C = expert_capacity(R, E) = R`` depends only on shapes (no
expert can receive more than the ``R`` rows there are, so nothing is ever dropped) and the
routing (``offsets``) is used only as runtime tensor data by the scatter/gather: the Neuron body
(the NKI kernel) is specialised once per shape, not per routing. Padding slots hold zeros and
SwiGLU maps a zero row to a zero row, so no mask is needed inside the body. On CPU/CUDA the body
is ``grouped_swiglu_math`` on the padded layout (static offsets ``C, 2C, ..., E*C``); this is
bitwise the unpadded computation at the dims tested in tests/kernels/test_custom_ops.py and
within rounding of it (f32 accumulation order of ``_grouped_mm``) at 30B dims. The backward
is unchanged (offset-based, below). Cost: the body computes ``E*R`` rows instead of ``R``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _aligned(*tensors: Tensor) -> bool:
    """torch._grouped_mm needs every non-unit stride to be a multiple of 16 bytes."""
    for t in tensors:
        for size, stride in zip(t.shape, t.stride()):
            if size > 1 and stride != 1 and (stride * t.element_size()) % 16:
                return False
    return True


def _row_bounds(offsets: Tensor) -> list[int]:
    return [0] + [int(v) for v in offsets.tolist()]


def grouped_mm(a: Tensor, b_t: Tensor, offsets: Tensor, *, allow_grouped_mm: bool = True) -> Tensor:
    """Row-grouped ``a (R, K) @ b_t[e] (K, N)`` for each expert's rows -> ``(R, N)``.

    ``torch._grouped_mm`` when allowed and the strides permit, else one ``mm`` per expert."""
    if allow_grouped_mm and _aligned(a, b_t) and b_t.shape[-1] * a.element_size() % 16 == 0:
        return torch._grouped_mm(a, b_t, offs=offsets)
    out = a.new_zeros(a.shape[0], b_t.shape[-1])
    bounds = _row_bounds(offsets)
    for e in range(b_t.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = a[lo:hi] @ b_t[e]
    return out


def grouped_mm_weight_grad(a: Tensor, g: Tensor, offsets: Tensor) -> Tensor:
    """Per-expert ``a[rows_e].T @ g[rows_e]`` -> ``(E, K, N)`` (the derivative of ``b_t``)."""
    a_t = a.transpose(-2, -1)
    if _aligned(a_t, g) and g.shape[-1] * g.element_size() % 16 == 0 and a.shape[-1] * a.element_size() % 16 == 0:
        return torch._grouped_mm(a_t, g, offs=offsets)
    num_experts = offsets.shape[0]
    out = a.new_zeros(num_experts, a.shape[-1], g.shape[-1])
    bounds = _row_bounds(offsets)
    for e in range(num_experts):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[e] = a_t[:, lo:hi] @ g[lo:hi]
    return out


def _owned_rows(offsets: Tensor, num_rows: int, device) -> Tensor:
    """(R, 1) bool: row r belongs to some expert (r < offsets[-1]); no host sync."""
    if offsets.numel() == 0:
        return torch.zeros(num_rows, 1, dtype=torch.bool, device=device)
    return (torch.arange(num_rows, device=device) < offsets[-1].to(device))[:, None]


def _check(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"x_RD must be 2-D (rows, dim); got {tuple(x.shape)}")
    if offsets.dim() != 1 or offsets.dtype != torch.int32:
        raise ValueError(f"offsets_E must be a 1-D int32 tensor; got {offsets.dtype} {tuple(offsets.shape)}")
    num_experts, hidden, dim = w1.shape
    if w3.shape != w1.shape or w2.shape != (num_experts, dim, hidden):
        raise ValueError(f"weight shapes w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}, w3 {tuple(w3.shape)} disagree")
    if x.shape[1] != dim or offsets.shape[0] != num_experts:
        raise ValueError(f"x {tuple(x.shape)} / offsets {tuple(offsets.shape)} do not match weights {tuple(w1.shape)}")


def _gate_up(x: Tensor, offsets: Tensor, w1: Tensor, w3: Tensor) -> tuple[Tensor, Tensor]:
    # Two separate casts of x, as GroupedExperts.forward writes it: under autograd the two
    # gradient contributions then meet in x's dtype, not in bfloat16.
    a = grouped_mm(x.bfloat16(), w1.bfloat16().transpose(-2, -1), offsets)
    b = grouped_mm(x.bfloat16(), w3.bfloat16().transpose(-2, -1), offsets)
    return a, b


def grouped_swiglu_math(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """The op's forward in plain torch (used by the CPU/CUDA kernel)."""
    a, b = _gate_up(x, offsets, w1, w3)
    h = F.silu(a) * b
    y = grouped_mm(h, w2.bfloat16().transpose(-2, -1), offsets)
    y = torch.where(_owned_rows(offsets, x.shape[0], x.device), y, torch.zeros((), dtype=y.dtype, device=y.device))
    return y.type_as(x).contiguous()


def expert_capacity(num_rows: int, num_experts: int) -> int:
    """Static per-expert capacity of the padded layout: ``num_rows`` (no routing can overflow it)."""
    return num_rows


def padded_slots(offsets: Tensor, num_rows: int, capacity: int) -> Tensor:
    """(R,) int64: row ``r`` of expert ``e`` -> slot ``e*C + (r - start_e)``; a row owned by no
    expert (``r >= offsets[-1]``) -> the discard slot ``E*C``. Tensor ops only (no host sync)."""
    num_experts = offsets.shape[0]
    rows = torch.arange(num_rows, device=offsets.device)
    if num_experts == 0:
        return torch.zeros_like(rows)
    ends = offsets.to(torch.int64)
    expert = torch.searchsorted(ends, rows, right=True)  # how many experts end at or before r
    starts = torch.cat((ends.new_zeros(1), ends[:-1]))
    clamped = expert.clamp(max=num_experts - 1)
    slot = clamped * capacity + rows - starts[clamped]
    return torch.where(expert < num_experts, slot, torch.full_like(slot, num_experts * capacity))


def pad_by_expert(x: Tensor, slots: Tensor, num_experts: int, capacity: int) -> Tensor:
    """``(E*C, D)`` zero buffer with each row of ``x`` at its slot (unowned rows discarded)."""
    buffer = x.new_zeros(num_experts * capacity + 1, x.shape[1])
    buffer[slots] = x
    return buffer[: num_experts * capacity]


def unpad(y_padded: Tensor, slots: Tensor) -> Tensor:
    """Rows back in ``x``'s order; a row whose slot is the discard slot is zero."""
    return torch.cat((y_padded, y_padded.new_zeros(1, y_padded.shape[1]))).index_select(0, slots)


def padded_offsets(num_experts: int, capacity: int, device) -> Tensor:
    """The static offsets of the padded layout: ``C, 2C, ..., E*C`` (int32)."""
    return torch.arange(1, num_experts + 1, dtype=torch.int32, device=device) * capacity


def grouped_swiglu_padded(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, body) -> Tensor:
    """The code path around every device's kernel body: pad, ``body(x_padded, w1, w2, w3)``
    (``(E*C, D)`` -> ``(E*C, D)``, expert ``e`` on slots ``e*C:(e+1)*C``), unpad."""
    num_experts = w1.shape[0]
    capacity = expert_capacity(x.shape[0], num_experts)
    slots = padded_slots(offsets, x.shape[0], capacity)
    y_padded = body(pad_by_expert(x, slots, num_experts, capacity), w1, w2, w3)
    return unpad(y_padded, slots).to(x.dtype).contiguous()


def _torch_body(x_padded: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    capacity = x_padded.shape[0] // max(w1.shape[0], 1)
    return grouped_swiglu_math(x_padded, padded_offsets(w1.shape[0], capacity, x_padded.device), w1, w2, w3)


@torch.library.custom_op("harness::grouped_swiglu", mutates_args=(), device_types=("cpu", "cuda"))
def grouped_swiglu(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """SwiGLU expert MLP over expert-sorted rows; see the module docstring."""
    _check(x, offsets, w1, w2, w3)
    return grouped_swiglu_padded(x, offsets, w1, w2, w3, _torch_body)


@grouped_swiglu.register_fake
def _grouped_swiglu_fake(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    _check(x, offsets, w1, w2, w3)
    return x.new_empty(x.shape)


def grouped_swiglu_backward_math(grad, x, offsets, w1, w2, w3, needs):
    """(dx, None, dw1, dw2, dw3), each as torchtitan's autograd computes it."""
    owned = _owned_rows(offsets, x.shape[0], x.device)
    g = grad.contiguous().bfloat16()  # backward of .type_as(x) (a no-op cast when x is bf16)
    x_b = x.bfloat16()
    w1_b, w2_b, w3_b = w1.bfloat16(), w2.bfloat16(), w3.bfloat16()
    a, b = _gate_up(x, offsets, w1, w3)
    s = F.silu(a)
    h = s * b
    # y = grouped_mm(h, w2_b^T): dh = g @ w2_b ; d(w2_b^T) = h^T g per expert
    dh = grouped_mm(g, w2_b, offsets)
    dw2 = grouped_mm_weight_grad(h, g, offsets).transpose(-2, -1).to(w2.dtype) if needs[3] else None
    ds = dh * b
    db = dh * s
    da = torch.ops.aten.silu_backward(ds, a)
    dx = dw1 = dw3 = None
    if needs[0]:
        dx_a = grouped_mm(da, w1_b, offsets).to(x.dtype)
        dx_b = grouped_mm(db, w3_b, offsets).to(x.dtype)
        dx = dx_a + dx_b
        dx = torch.where(owned, dx, torch.zeros((), dtype=dx.dtype, device=dx.device))
    if needs[2]:
        dw1 = grouped_mm_weight_grad(x_b, da, offsets).transpose(-2, -1).to(w1.dtype)
    if needs[4]:
        dw3 = grouped_mm_weight_grad(x_b, db, offsets).transpose(-2, -1).to(w3.dtype)
    return dx, None, dw1, dw2, dw3


def _setup_context(ctx, inputs, output) -> None:
    x, offsets, w1, w2, w3 = inputs
    ctx.save_for_backward(x, offsets, w1, w2, w3)


def _backward(ctx, grad: Tensor):
    x, offsets, w1, w2, w3 = ctx.saved_tensors
    return grouped_swiglu_backward_math(grad, x, offsets, w1, w2, w3, ctx.needs_input_grad)


grouped_swiglu.register_autograd(_backward, setup_context=_setup_context)

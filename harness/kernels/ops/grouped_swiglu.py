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

The blockwise contract (every device). The forward runs as ``block -> body -> unblock``
(``grouped_swiglu_blockwise``), the layout of nki-library's blockwise MoE kernels:

* expert ``e``'s ``c_e`` rows fill ``ceil(c_e / B)`` consecutive blocks of ``B = BLOCK_SIZE``
  rows (the last one zero-padded); the blocks of expert ``e`` follow those of ``e - 1``;
* ``block_expert (N,)`` int32 says which expert each block belongs to: routing as *data*;
* the block count ``N = max_blocks(R, E, B)`` comes from shapes only, and bounds every
  routing: one compiled kernel shape serves them all (``max_blocks`` proves the bound and shows
  it attained). Blocks past the last used one hold zero rows and belong to expert ``E - 1``
  (a valid index, so every weight load stays in bounds); SwiGLU maps a zero row to zero, and
  ``unblock`` never reads a padding slot.

``block_layout`` computes the slots and the map with tensor ops only (no host sync). The body
(``(N*B, D)`` rows, ``block_expert``, weights) -> ``(N*B, D)``: on CPU/CUDA ``grouped_swiglu_math``
over the blocks (each expert's segment is its blocks, so the grouped GEMMs see each expert's
rows plus its zero padding rows; bitwise the unblocked computation at the dims of
tests/kernels/test_custom_ops.py); on Neuron the NKI kernel (harness/kernels/ops/nki/grouped_swiglu_kernel.py),
whose torch twin walks the same blocks. Cost: at most ``N*B <= R + E*(B-1)`` rows instead of
``R`` (harness/kernels/ops/nki/grouped_swiglu_cost.py has the full-shape numbers).

The backward is an operator of its own, ``torch.ops.harness.grouped_swiglu_backward(grad, x,
offsets, w1, w2, w3) -> (dx, dw1, dw2, dw3)``, which the forward's registered autograd formula
calls, so each device has its own backward kernel:

* CPU/CUDA: the offset-based formulas below (``grouped_swiglu_backward_math``). Each step is the
  same op autograd would run for torchtitan's forward, so forward and backward are bitwise
  torchtitan's on CPU; the recorded losses rest on it;
* Neuron: NKI, registered by ``harness.kernels.ops.neuron`` -- nki-library's blockwise backward
  (``experimental/moe/bwd``) fed by our forward kernel's recompute of the activations
  (harness/kernels/ops/nki/grouped_swiglu_backward.py). Its rounding is the library's (block
  contributions to ``dW`` added in bfloat16), held to the kernel tolerance against the float64
  derivative and torchtitan's (tests/kernels/test_moe_backward.py). Nothing in it uses
  ``dma_copy(dst_rmw_op=...)``, which NKI 0.3 removed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _aligned(*tensors: Tensor) -> bool:
    """torch._grouped_mm needs every non-unit stride to be a multiple of 16 bytes."""
    for t in tensors:
        for size, stride in zip(t.shape, t.stride(), strict=True):
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


BLOCK_SIZE = 32  # rows per block; the choice is tabulated in harness/kernels/ops/nki/grouped_swiglu_cost.py


def max_blocks(num_rows: int, num_experts: int, block_size: int = BLOCK_SIZE) -> int:
    """The most blocks any routing of ``num_rows`` rows over ``num_experts`` experts can fill.

    Proof. With ``k`` non-empty experts (``k <= min(E, R)``), each fills
    ``ceil(c/B) = 1 + floor((c-1)/B)`` blocks, so the total is
    ``k + sum floor((c_e-1)/B) <= k + floor((R-k)/B)`` (a sum of floors is at most the floor of
    the sum). Going from ``k`` to ``k+1`` adds 1 and takes at most 1 from the floor, so the bound
    is largest at ``k = min(E, R)``: ``N = min(E, R) + floor((R - min(E, R)) / B)``. It is
    attained (``min(E, R) - 1`` experts with one row, one expert with the rest), so no smaller
    static count is safe. Rows owned by no expert only lower the count. ``N*B <= R + E*(B-1)``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be a positive int; got {block_size}")
    nonempty = min(num_experts, num_rows)
    return nonempty + (num_rows - nonempty) // block_size


def block_layout(offsets: Tensor, num_rows: int, block_size: int = BLOCK_SIZE) -> tuple[Tensor, Tensor]:
    """``(slots (R,) int64, block_expert (N,) int32)`` for expert-sorted rows; tensor ops only.

    Row ``r`` of expert ``e`` (``offsets[e-1] <= r < offsets[e]``) goes to slot
    ``first_block_e * B + (r - offsets[e-1])``; a row owned by no expert (``r >= offsets[-1]``)
    to the discard slot ``N*B``. Block ``n`` belongs to the expert whose blocks cover it; the
    blocks past the last used one to expert ``E - 1``."""
    num_experts = offsets.shape[0]
    num_blocks = max_blocks(num_rows, num_experts, block_size)
    device = offsets.device
    rows = torch.arange(num_rows, device=device)
    if num_experts == 0:
        return torch.zeros_like(rows), torch.zeros(0, dtype=torch.int32, device=device)
    ends = offsets.to(torch.int64)
    starts = torch.cat((ends.new_zeros(1), ends[:-1]))
    blocks_per_expert = (ends - starts + block_size - 1) // block_size
    block_ends = torch.cumsum(blocks_per_expert, 0)
    first_block = block_ends - blocks_per_expert
    expert = torch.searchsorted(ends, rows, right=True)  # how many experts end at or before r
    clamped = expert.clamp(max=num_experts - 1)
    slot = first_block[clamped] * block_size + rows - starts[clamped]
    slots = torch.where(expert < num_experts, slot, torch.full_like(slot, num_blocks * block_size))
    blocks = torch.arange(num_blocks, device=device)
    block_expert = torch.searchsorted(block_ends, blocks, right=True).clamp(max=num_experts - 1)
    return slots, block_expert.to(torch.int32)


def to_blocks(x: Tensor, slots: Tensor, num_slots: int) -> Tensor:
    """``(num_slots, D)`` zero buffer with each row of ``x`` at its slot (unowned rows discarded)."""
    buffer = x.new_zeros(num_slots + 1, x.shape[1])
    buffer[slots] = x
    return buffer[:num_slots]


def from_blocks(y_blocked: Tensor, slots: Tensor) -> Tensor:
    """Rows back in ``x``'s order; a row whose slot is the discard slot is zero."""
    return torch.cat((y_blocked, y_blocked.new_zeros(1, y_blocked.shape[1]))).index_select(0, slots)


def block_offsets(block_expert: Tensor, num_experts: int, block_size: int) -> Tensor:
    """int32 cumulative rows per expert of the blocked layout (each expert's segment = its blocks)."""
    counts = torch.bincount(block_expert.to(torch.int64), minlength=num_experts) * block_size
    return torch.cumsum(counts, 0, dtype=torch.int32)


def grouped_swiglu_blockwise(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, body,
                             block_size: int = BLOCK_SIZE) -> Tensor:
    """The code path around every device's kernel body: block, ``body(x_blocked, block_expert,
    w1, w2, w3)`` (``(N*B, D)`` -> ``(N*B, D)``, block ``n`` = rows ``n*B:(n+1)*B`` computed with
    expert ``block_expert[n]``), unblock."""
    slots, block_expert = block_layout(offsets, x.shape[0], block_size)
    num_slots = block_expert.shape[0] * block_size
    if num_slots == 0:
        return x.new_zeros(x.shape)
    y_blocked = body(to_blocks(x, slots, num_slots), block_expert, w1, w2, w3)
    return from_blocks(y_blocked, slots).to(x.dtype).contiguous()


def _torch_body(x_blocked: Tensor, block_expert: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    block_size = x_blocked.shape[0] // block_expert.shape[0]
    return grouped_swiglu_math(x_blocked, block_offsets(block_expert, w1.shape[0], block_size), w1, w2, w3)


@torch.library.custom_op("harness::grouped_swiglu", mutates_args=(), device_types=("cpu", "cuda"))
def grouped_swiglu(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """SwiGLU expert MLP over expert-sorted rows; see the module docstring."""
    _check(x, offsets, w1, w2, w3)
    return grouped_swiglu_blockwise(x, offsets, w1, w2, w3, _torch_body)


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


@torch.library.custom_op("harness::grouped_swiglu_backward", mutates_args=(), device_types=("cpu", "cuda"))
def grouped_swiglu_backward(grad: Tensor, x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor,
                            w3: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dw1, dw2, dw3) of ``harness::grouped_swiglu`` for the upstream ``grad``."""
    _check(x, offsets, w1, w2, w3)
    grads = grouped_swiglu_backward_math(grad, x, offsets, w1, w2, w3, (True,) * 5)
    return tuple(g.contiguous() for g in grads if g is not None)


@grouped_swiglu_backward.register_fake
def _grouped_swiglu_backward_fake(grad, x, offsets, w1, w2, w3):
    _check(x, offsets, w1, w2, w3)
    return x.new_empty(x.shape), w1.new_empty(w1.shape), w2.new_empty(w2.shape), w3.new_empty(w3.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, offsets, w1, w2, w3 = inputs
    ctx.save_for_backward(x, offsets, w1, w2, w3)


def _backward(ctx, grad: Tensor):
    x, offsets, w1, w2, w3 = ctx.saved_tensors
    dx, dw1, dw2, dw3 = torch.ops.harness.grouped_swiglu_backward(grad, x, offsets, w1, w2, w3)
    needs = ctx.needs_input_grad
    return (dx if needs[0] else None, None, dw1 if needs[2] else None, dw2 if needs[3] else None,
            dw3 if needs[4] else None)


grouped_swiglu.register_autograd(_backward, setup_context=_setup_context)

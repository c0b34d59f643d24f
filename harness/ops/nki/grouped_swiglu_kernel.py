"""NKI grouped SwiGLU expert MLP forward kernel. NOT YET RUN ON HARDWARE OR IN THE SIMULATOR.

Contract (kernel and its torch twin ``grouped_swiglu_kernel_torch.grouped_swiglu_kernel_torch_ref``
share it), feature-major so the contraction dimension sits on the partition axis of both
``nc_matmul`` operands, in the per-expert *capacity-padded* layout::

    xT  [D, E*C]   bfloat16; expert e's rows in columns e*C .. e*C+count_e, zeros elsewhere
    w1T [E, D, F]  w3T [E, D, F]  w2T [E, F, D]   bfloat16 (w1/w3/w2 transposed per expert)
    ->  yT [D, E*C] bfloat16 (zero in the padding columns: SwiGLU maps a zero row to zero)

Every argument is a tensor and ``C = xT.shape[1] // E`` comes from the shapes, so the kernel is
specialised (traced and compiled) once per shape. The routing never reaches it as a Python
value: ``harness.ops.grouped_swiglu.grouped_swiglu_padded`` scatters the rows into the padded
layout and gathers them back with tensor ops (the same path the CPU kernel of the op runs).
The previous contract took the per-expert counts as static Python ints and was re-specialised
for every routing (every step, every rank) -- with torchtitan's 100 s collective timeout after
step 1, a per-step compile on one rank becomes a collective timeout.

Per expert and per block of up to 512 columns: ``aT = w1[e] @ x^T`` and ``bT = w3[e] @ x^T``
accumulate in float32 PSUM over 128-row tiles of D and are rounded to bfloat16 (torchtitan's
``_grouped_mm`` returns bfloat16), ``hT = silu(aT) * bT`` in bfloat16, and
``yT = w2[e] @ h^T`` accumulates over 128-row tiles of F. Same rounding points as
``GroupedExperts.forward``. D and F must each be <= 128 or a multiple of 128.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # the real Neuron SDK only; the PyPI placeholder raises ImportError("WRONG PACKAGE ...")
    import nki
    import nki.isa as nisa
    import nki.language as nl

    NKI_IMPORT_ERROR = None
except Exception as _error:  # noqa: BLE001
    nki = nisa = nl = None
    NKI_IMPORT_ERROR = f"{type(_error).__name__}: {_error}"

ROW_BLOCK = 512  # moving free size limit of nc_matmul
PART = 128  # partition count


def kernel_layout(x_padded: Tensor, w1: Tensor, w2: Tensor, w3: Tensor):
    """Padded op layout (``x_padded (E*C, D)``, ``w1_EFD``, ``w2_EDF``, ``w3_EFD``) -> kernel arguments."""
    bf = torch.bfloat16
    return (
        x_padded.to(bf).t().contiguous(),
        w1.to(bf).transpose(-2, -1).contiguous(),
        w3.to(bf).transpose(-2, -1).contiguous(),
        w2.to(bf).transpose(-2, -1).contiguous(),
    )


def grouped_swiglu_via(call, x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """``harness::grouped_swiglu``'s padded path with ``call`` (kernel, simulated kernel or twin)
    as the body. ``offsets``: int32 cumulative rows per expert (runtime data)."""
    from harness.ops.grouped_swiglu import grouped_swiglu_padded

    def body(x_padded, w1_, w2_, w3_):
        yT = call(*kernel_layout(x_padded, w1_, w2_, w3_))
        return torch.as_tensor(yT).t()

    return grouped_swiglu_padded(x, offsets, w1, w2, w3, body)


def _tiles(n: int) -> list[tuple[int, int]]:
    if n <= PART:
        return [(0, n)]
    assert n % PART == 0, f"dimension {n} must be <= {PART} or a multiple of {PART}"
    return [(i, PART) for i in range(0, n, PART)]


def grouped_swiglu_kernel(xT, w1T, w3T, w2T):
    dim, columns = xT.shape
    experts, _, hidden = w1T.shape
    capacity = columns // experts
    d_tiles, f_tiles = _tiles(dim), _tiles(hidden)
    yT = nl.ndarray((dim, columns), dtype=xT.dtype, buffer=nl.shared_hbm)
    for e in range(experts):
        for r0 in range(e * capacity, (e + 1) * capacity, ROW_BLOCK):
            rn = min(ROW_BLOCK, (e + 1) * capacity - r0)
            x_sb = []
            for d0, dn in d_tiles:
                t = nl.ndarray((dn, rn), dtype=xT.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=t, src=xT[d0 : d0 + dn, r0 : r0 + rn])
                x_sb.append(t)
            h_sb = []
            for f0, fn in f_tiles:
                gate_up = []
                for wT in (w1T, w3T):
                    acc = nl.ndarray((fn, rn), dtype=nl.float32, buffer=nl.psum)
                    for k, (d0, dn) in enumerate(d_tiles):
                        w = nl.ndarray((dn, fn), dtype=wT.dtype, buffer=nl.sbuf)
                        nisa.dma_copy(dst=w, src=wT[e, d0 : d0 + dn, f0 : f0 + fn])
                        nisa.nc_matmul(dst=acc, stationary=w, moving=x_sb[k], accumulate=(k > 0))
                    rounded = nl.ndarray((fn, rn), dtype=nl.bfloat16, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=rounded, src=acc)
                    gate_up.append(rounded)
                act = nl.ndarray((fn, rn), dtype=nl.bfloat16, buffer=nl.sbuf)
                nisa.activation(dst=act, op=nl.silu, data=gate_up[0])
                h = nl.ndarray((fn, rn), dtype=nl.bfloat16, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=h, data1=act, data2=gate_up[1], op=nl.multiply)
                h_sb.append(h)
            for d0, dn in d_tiles:
                acc = nl.ndarray((dn, rn), dtype=nl.float32, buffer=nl.psum)
                for k, (f0, fn) in enumerate(f_tiles):
                    w = nl.ndarray((fn, dn), dtype=w2T.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=w, src=w2T[e, f0 : f0 + fn, d0 : d0 + dn])
                    nisa.nc_matmul(dst=acc, stationary=w, moving=h_sb[k], accumulate=(k > 0))
                out = nl.ndarray((dn, rn), dtype=xT.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=out, src=acc)
                nisa.dma_copy(dst=yT[d0 : d0 + dn, r0 : r0 + rn], src=out)
    return yT


# The undecorated function (its signature is checked against the twin's); the kernel proper
# exists only with the real nki.
grouped_swiglu_kernel_source = grouped_swiglu_kernel
grouped_swiglu_kernel = nki.jit(grouped_swiglu_kernel_source) if nki is not None else None


def grouped_swiglu_simulated(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """CPU: the NKI kernel under ``nki.simulate`` (needs the real ``nki``)."""
    if grouped_swiglu_kernel is None:
        raise RuntimeError(f"nki is not available: {NKI_IMPORT_ERROR}")
    return grouped_swiglu_via(nki.simulate(grouped_swiglu_kernel), x, offsets, w1, w2, w3)


def grouped_swiglu_neuron(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """The 'neuron' device kernel of ``harness::grouped_swiglu`` (registered by harness.ops.neuron).

    No host read of the routing: ``offsets`` stays a device tensor; the kernel sees only shapes.
    """
    return grouped_swiglu_via(grouped_swiglu_kernel, x, offsets, w1, w2, w3)

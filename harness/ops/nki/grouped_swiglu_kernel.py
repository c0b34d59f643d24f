"""NKI grouped SwiGLU expert MLP forward kernel. NOT YET RUN ON HARDWARE OR IN THE SIMULATOR.

Contract (kernel and reference share it), feature-major so the contraction dimension sits on
the partition axis of both ``nc_matmul`` operands::

    xT  [D, R]     expert-sorted rows, bfloat16
    w1T [E, D, F]  w3T [E, D, F]  w2T [E, F, D]   bfloat16 (w1/w3/w2 transposed per expert)
    counts         tuple of E Python ints (rows per expert; static, the kernel is traced per
                   routing -- fine for the simulator and for tests, not for training)
    ->  yT [D, R]  bfloat16; columns past sum(counts) are zero

Per expert and per block of up to 512 rows: ``aT = w1[e] @ x^T`` and ``bT = w3[e] @ x^T``
accumulate in float32 PSUM over 128-row tiles of D and are rounded to bfloat16 (torchtitan's
``_grouped_mm`` returns bfloat16), ``hT = silu(aT) * bT`` in bfloat16, and
``yT = w2[e] @ h^T`` accumulates over 128-row tiles of F. Same rounding points as
``GroupedExperts.forward``. D and F must each be <= 128 or a multiple of 128.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


def grouped_swiglu_reference(xT: Tensor, w1T: Tensor, w3T: Tensor, w2T: Tensor, counts) -> Tensor:
    """Torch twin of ``grouped_swiglu_kernel``: same arguments, layout and rounding points."""
    bf = torch.bfloat16
    yT = torch.zeros(w2T.shape[-1], xT.shape[1], dtype=bf)
    start = 0
    for e, count in enumerate(counts):
        cols = slice(start, start + count)
        x_e = xT[:, cols].to(bf)
        a = (w1T[e].to(bf).t().float() @ x_e.float()).to(bf)
        b = (w3T[e].to(bf).t().float() @ x_e.float()).to(bf)
        h = F.silu(a) * b
        yT[:, cols] = (w2T[e].to(bf).t().float() @ h.float()).to(bf)
        start += count
    return yT


def kernel_layout(x: Tensor, counts, w1: Tensor, w2: Tensor, w3: Tensor):
    """Op layout (``x_RD``, ``w1_EFD``, ``w2_EDF``, ``w3_EFD``) -> kernel layout arguments."""
    bf = torch.bfloat16
    return (
        x.to(bf).t().contiguous(),
        w1.to(bf).transpose(-2, -1).contiguous(),
        w3.to(bf).transpose(-2, -1).contiguous(),
        w2.to(bf).transpose(-2, -1).contiguous(),
        tuple(int(c) for c in counts),
    )


def grouped_swiglu_via(call, x: Tensor, counts, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    yT = call(*kernel_layout(x, counts, w1, w2, w3))
    return torch.as_tensor(yT).t().contiguous().to(x.dtype)


def _tiles(n: int) -> list[tuple[int, int]]:
    if n <= PART:
        return [(0, n)]
    assert n % PART == 0, f"dimension {n} must be <= {PART} or a multiple of {PART}"
    return [(i, PART) for i in range(0, n, PART)]


if nki is not None:

    @nki.jit
    def grouped_swiglu_kernel(xT, w1T, w3T, w2T, counts):
        dim, rows = xT.shape
        hidden = w1T.shape[-1]
        d_tiles, f_tiles = _tiles(dim), _tiles(hidden)
        yT = nl.ndarray((dim, rows), dtype=xT.dtype, buffer=nl.shared_hbm)
        used = sum(counts)
        if used < rows:  # unowned columns are zero (as in the torch kernel)
            for d0, dn in d_tiles:
                zero = nl.ndarray((dn, rows - used), dtype=xT.dtype, buffer=nl.sbuf)
                nisa.memset(dst=zero, value=0.0)
                nisa.dma_copy(dst=yT[d0 : d0 + dn, used:rows], src=zero)
        start = 0
        for e, count in enumerate(counts):
            for r0 in range(start, start + count, ROW_BLOCK):
                rn = min(ROW_BLOCK, start + count - r0)
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
            start += count
        return yT

else:
    grouped_swiglu_kernel = None


def counts_from_offsets(offsets: Tensor) -> list[int]:
    bounds = [0] + [int(v) for v in offsets.tolist()]
    return [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]


def grouped_swiglu_simulated(x: Tensor, counts, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """CPU: the NKI kernel under ``nki.simulate`` (needs the real ``nki``)."""
    if grouped_swiglu_kernel is None:
        raise RuntimeError(f"nki is not available: {NKI_IMPORT_ERROR}")
    return grouped_swiglu_via(nki.simulate(grouped_swiglu_kernel), x, counts, w1, w2, w3)


def grouped_swiglu_neuron(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """The 'neuron' device kernel of ``harness::grouped_swiglu`` (registered by harness.ops.neuron).

    The routing (counts) is read to the host: the kernel is specialised per routing.
    """
    return grouped_swiglu_via(grouped_swiglu_kernel, x, counts_from_offsets(offsets.cpu()), w1, w2, w3)

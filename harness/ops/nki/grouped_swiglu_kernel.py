"""NKI blockwise grouped SwiGLU expert MLP forward kernel. NOT YET RUN ON HARDWARE.

The layout is nki-library's blockwise MoE (``core/moe/moe_cte/bwmm_*``): rows padded into blocks
of ``B`` rows, each block computed with the expert a *tensor* names. Contract (the kernel and
its torch twin ``grouped_swiglu_kernel_torch.grouped_swiglu_kernel_torch_ref`` share it),
feature-major so the contraction dimension sits on the partition axis of both ``nc_matmul``
operands::

    xT           [D, N*B]  bfloat16; block n = columns n*B .. (n+1)*B (zero columns: padding)
    block_expert [N, 1]    int32; the expert of block n, 0 <= block_expert[n] < E
    w1T [E, D, F]  w3T [E, D, F]  w2T [E, F, D]   bfloat16 (w1/w3/w2 transposed per expert)
    ->  yT [D, N*B] bfloat16 (zero in the padding columns: SwiGLU maps a zero row to zero)

Every argument is a tensor; ``N = block_expert.shape[0]`` and ``B = xT.shape[1] // N`` come
from the shapes, and ``N = max_blocks(R, E, B)`` (harness/ops/grouped_swiglu.py) bounds every
routing, so the kernel is specialised (traced and compiled) once per shape: the routing
reaches it only as the data of ``block_expert``. ``grouped_swiglu_via`` lays the rows out in
blocks and back with tensor ops (the code path the CPU kernel of the op runs).

Per block ``n`` (a Python loop: NKI 0.7 unrolls it while tracing, so the instruction count is
``N`` times the body's; harness/ops/nki/grouped_swiglu_cost.py counts it):

1. the block's expert id: ``block_expert[n]`` -> a ``(1, 1)`` int32 SBUF tile;
2. the expert's weights, loaded by that id: ``dma_copy`` from ``w.ap(pattern, scalar_offset=id,
   indirect_dim=0)``, the NKI access pattern whose start moves by ``id * D * F`` elements at run
   time (NKI access-patterns deep dive; nki-library's bwmm kernels load expert weights so).
   One DMA per weight: ``[128, D/128, F]`` for w1/w3, ``[128, F/128, D]`` for w2. An id out of
   range is a runtime DMA error (``oob_mode.error``, the default), never a silent read;
3. the block's rows, one DMA ``[128, D/128, B]``;
4. ``aT = w1[e] @ x^T`` and ``bT = w3[e] @ x^T`` accumulate in float32 PSUM over 128-row tiles
   of D and are rounded to bfloat16 (torchtitan's ``_grouped_mm`` returns bfloat16),
   ``hT = silu(aT) * bT`` in bfloat16, ``yT = w2[e] @ h^T`` accumulates over 128-row tiles of F
   and is rounded to bfloat16: the rounding points of ``GroupedExperts.forward``;
5. the block's outputs, one DMA.

D and F must each be <= 128 or a multiple of 128; ``B <= 512`` (the moving free size of
``nc_matmul``). The backward is torch (harness/ops/grouped_swiglu.py says why).
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

PART = 128  # partition count
MOVING_MAX = 512  # moving free size limit of nc_matmul


def tile_count(n: int) -> int:
    """Number of partition tiles of a dimension (the kernel's and the cost model's one rule)."""
    if n <= PART:
        return 1
    if n % PART:
        raise ValueError(f"dimension {n} must be <= {PART} or a multiple of {PART}")
    return n // PART


def kernel_layout(x_blocked: Tensor, block_expert: Tensor, w1: Tensor, w2: Tensor, w3: Tensor):
    """Blocked op layout (``x_blocked (N*B, D)``, ``block_expert (N,)``, ``w1_EFD``, ``w2_EDF``,
    ``w3_EFD``) -> the kernel's arguments."""
    bf = torch.bfloat16
    return (
        x_blocked.to(bf).t().contiguous(),
        block_expert.to(torch.int32).reshape(-1, 1).contiguous(),
        w1.to(bf).transpose(-2, -1).contiguous(),
        w3.to(bf).transpose(-2, -1).contiguous(),
        w2.to(bf).transpose(-2, -1).contiguous(),
    )


def grouped_swiglu_via(call, x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """``harness::grouped_swiglu``'s blockwise path with ``call`` (kernel, emulated or simulated
    kernel, or twin) as the body: ``call(xT, block_expert, w1T, w3T, w2T) -> yT``.
    ``offsets``: int32 cumulative rows per expert (runtime data)."""
    from harness.ops.grouped_swiglu import grouped_swiglu_blockwise

    def body(x_blocked, block_expert, w1_, w2_, w3_):
        yT = call(*kernel_layout(x_blocked, block_expert, w1_, w2_, w3_))
        return torch.as_tensor(yT).t()

    return grouped_swiglu_blockwise(x, offsets, w1, w2, w3, body)


def grouped_swiglu_kernel(xT, block_expert, w1T, w3T, w2T):
    dim, slots = xT.shape
    num_blocks = block_expert.shape[0]
    block = slots // num_blocks
    hidden = w1T.shape[2]
    kd, kf = tile_count(dim), tile_count(hidden)
    pd, pf = min(dim, PART), min(hidden, PART)
    assert block * num_blocks == slots and block <= MOVING_MAX, f"block size {block} must divide {slots} and be <= {MOVING_MAX}"
    yT = nl.ndarray((dim, slots), dtype=xT.dtype, buffer=nl.shared_hbm)
    for n in range(num_blocks):
        c0 = n * block
        expert = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=expert, src=block_expert[n : n + 1, 0:1])
        # weights of expert `expert`: element (p, k, f) = wT[expert, k*pd + p, f]
        w1_sb = nl.ndarray((pd, kd, hidden), dtype=w1T.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w1_sb, src=w1T.ap(pattern=[[hidden, pd], [pd * hidden, kd], [1, hidden]],
                                            offset=0, scalar_offset=expert, indirect_dim=0))
        w3_sb = nl.ndarray((pd, kd, hidden), dtype=w3T.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w3_sb, src=w3T.ap(pattern=[[hidden, pd], [pd * hidden, kd], [1, hidden]],
                                            offset=0, scalar_offset=expert, indirect_dim=0))
        w2_sb = nl.ndarray((pf, kf, dim), dtype=w2T.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w2_sb, src=w2T.ap(pattern=[[dim, pf], [pf * dim, kf], [1, dim]],
                                            offset=0, scalar_offset=expert, indirect_dim=0))
        # the block's rows: element (p, k, b) = xT[k*pd + p, c0 + b]
        x_sb = nl.ndarray((pd, kd, block), dtype=xT.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb, src=xT.ap(pattern=[[slots, pd], [pd * slots, kd], [1, block]], offset=c0))
        h_sb = nl.ndarray((pf, kf, block), dtype=nl.bfloat16, buffer=nl.sbuf)
        for j in range(kf):
            f0 = j * pf
            gate_up = []
            for w_sb in (w1_sb, w3_sb):
                acc = nl.ndarray((pf, block), dtype=nl.float32, buffer=nl.psum)
                for k in range(kd):
                    nisa.nc_matmul(dst=acc, stationary=w_sb[:, k, f0 : f0 + pf], moving=x_sb[:, k, :], accumulate=(k > 0))
                rounded = nl.ndarray((pf, block), dtype=nl.bfloat16, buffer=nl.sbuf)
                nisa.tensor_copy(dst=rounded, src=acc)
                gate_up.append(rounded)
            act = nl.ndarray((pf, block), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.activation(dst=act, op=nl.silu, data=gate_up[0])
            nisa.tensor_tensor(dst=h_sb[:, j, :], data1=act, data2=gate_up[1], op=nl.multiply)
        y_sb = nl.ndarray((pd, kd, block), dtype=xT.dtype, buffer=nl.sbuf)
        for k in range(kd):
            d0 = k * pd
            acc = nl.ndarray((pd, block), dtype=nl.float32, buffer=nl.psum)
            for j in range(kf):
                nisa.nc_matmul(dst=acc, stationary=w2_sb[:, j, d0 : d0 + pd], moving=h_sb[:, j, :], accumulate=(j > 0))
            nisa.tensor_copy(dst=y_sb[:, k, :], src=acc)
        nisa.dma_copy(dst=yT.ap(pattern=[[slots, pd], [pd * slots, kd], [1, block]], offset=c0), src=y_sb)
    return yT


# The undecorated function (its signature is checked against the twin's; an emulator traces
# it); the kernel proper exists only with the real nki.
grouped_swiglu_kernel_source = grouped_swiglu_kernel
grouped_swiglu_kernel = nki.jit(grouped_swiglu_kernel_source) if nki is not None else None


def grouped_swiglu_simulated(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """CPU: the NKI kernel under ``nki.simulate`` pinned to trn2 (needs the real ``nki``)."""
    from harness.ops.nki.simulation import simulated

    if grouped_swiglu_kernel is None:
        raise RuntimeError(f"nki is not available: {NKI_IMPORT_ERROR}")
    return grouped_swiglu_via(simulated(grouped_swiglu_kernel), x, offsets, w1, w2, w3)


def grouped_swiglu_emulated(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """CPU: the kernel body on the harness's NKI emulator (device tier ``nki-emu``)."""
    from harness import nki_emu

    module = nki_emu.import_module(__name__)
    return grouped_swiglu_via(nki_emu.run(module.grouped_swiglu_kernel), x, offsets, w1, w2, w3)


def grouped_swiglu_neuron(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """The 'neuron' device kernel of ``harness::grouped_swiglu`` (registered by harness.ops.neuron).

    No host read of the routing: ``offsets`` and ``block_expert`` stay device tensors; the
    kernel sees only shapes."""
    return grouped_swiglu_via(grouped_swiglu_kernel, x, offsets, w1, w2, w3)

"""NKI blockwise grouped SwiGLU expert MLP forward kernel. NOT YET RUN ON HARDWARE.

The layout is nki-library's blockwise MoE (``core/moe/moe_cte/bwmm_*``): rows padded into blocks
of ``B`` rows, each block computed with the expert a *tensor* names; the weights are in
nki-library's layout, the one its blockwise backward (``experimental/moe/bwd``) takes too, so
one transpose per call serves the forward and the backward. Contract (the kernels and their
torch twins in ``grouped_swiglu_kernel_torch.py`` share it)::

    x_blocks    [N, P_D, K_D, B]  bfloat16; element (n, p, k, b) = row n*B + b of the blocked
                                  rows, feature k*P_D + p (zero rows: padding)
    weight_load [N, 1]  int32;    the expert whose weights block n loads, or E: keep the weights
                                  this program loaded last (the first block of each program loads)
    gate_up     [E, D, 2, F]      bfloat16; gate_up[e, d, 0, f] = w1[e, f, d], [e, d, 1, f] = w3[e, f, d]
    down        [E, F, D]         bfloat16; down[e, f, d] = w2[e, d, f]
    ->  y_blocks [N, P_D, K_D, B] bfloat16, x_blocks' layout (zero rows give zero outputs)
    and, from ``grouped_swiglu_checkpoint_kernel`` only,
        act_blocks [N, P_F, 2, K_F, B] bfloat16: the gate (0) and up (1) projections before the
                                  activation, as the backward needs them

``P_D = min(D, 128)``, ``K_D = D / P_D`` (the same for F). Every argument is a tensor and the
routing reaches the kernel only as the data of ``weight_load``: one compiled kernel per shape.

Per program (LNC=2: ``kernel[2]``, ``nl.program_id(0)`` in 0..1), the contiguous half of the
blocks ``[p * ceil(N/2), (p+1) * ceil(N/2))``; the blocks are sorted by expert, so each program
meets each expert in one run of blocks. Per block ``n`` (a Python loop: NKI 0.7 unrolls it while
tracing; harness/kernels/ops/nki/grouped_swiglu_cost.py counts it):

1. ``weight_load[n]`` -> a ``(1, 1)`` int32 SBUF tile;
2. the expert's weights into the program's weight tiles, two DMAs at
   ``.ap(pattern, scalar_offset=id, indirect_dim=0)`` with ``oob_mode.skip``: an id of ``E`` points
   past the tensor, the DMA moves nothing and the tiles keep the weights of the run's first block
   (nki-library's ``bwmm_shard_on_block`` skips same-expert loads the same way under
   ``skip_weight``). Each partition reads runs of ``2F`` (gate_up) and ``D`` (down) contiguous
   elements. Weight traffic: at most one load per expert per program, whatever the routing;
3. the block's rows, one DMA, ``K_D * B`` contiguous elements per partition;
4. ``aT = w1[e] @ x^T`` and ``bT = w3[e] @ x^T`` accumulate in float32 PSUM over the 128-row tiles
   of D and are rounded to bfloat16 (torchtitan's ``_grouped_mm`` returns bfloat16),
   ``hT = silu(aT) * bT`` in bfloat16, ``yT = w2[e] @ h^T`` accumulates over the tiles of F and
   is rounded to bfloat16: the rounding points of ``GroupedExperts.forward``;
5. the block's outputs (and with ``checkpoint`` the rounded ``aT``, ``bT``), one DMA each.

D and F must each be <= 128 or a multiple of 128; ``B <= 512`` (the moving free size of
``nc_matmul``). ``grouped_swiglu_via`` lays the rows out in blocks and back with tensor ops (the
code path the CPU kernel of the op runs); ``weight_loads`` builds the load map from the
blocks' experts on the device (no host read).
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.kernels import emu as nki_emu
from harness.kernels.ops.grouped_swiglu import grouped_swiglu_blockwise
from harness.kernels.ops.nki.simulation import simulated

try:  # the real Neuron SDK only; the PyPI placeholder raises ImportError("WRONG PACKAGE ...")
    import nki
    import nki.isa as nisa
    import nki.language as nl

    NKI_IMPORT_ERROR = None
except Exception as _error:
    nki = nisa = nl = None
    NKI_IMPORT_ERROR = f"{type(_error).__name__}: {_error}"

PART = 128  # partition count
MOVING_MAX = 512  # moving free size limit of nc_matmul
PROGRAMS = 2  # LNC=2, trn2's default: the kernel is launched as kernel[PROGRAMS]


def tile_count(n: int) -> int:
    """Number of partition tiles of a dimension (the kernel's and the cost model's one rule)."""
    if n <= PART:
        return 1
    if n % PART:
        raise ValueError(f"dimension {n} must be <= {PART} or a multiple of {PART}")
    return n // PART


def program_blocks(num_blocks: int, programs: int, program: int) -> range:
    """The contiguous run of blocks program ``program`` of ``programs`` computes."""
    per = -(-num_blocks // programs)
    return range(program * per, min(num_blocks, (program + 1) * per))


# ------------------------------------------------------------------ torch-side layout


def to_kernel_blocks(rows: Tensor, num_blocks: int) -> Tensor:
    """``(N*B, D)`` blocked rows -> ``[N, P_D, K_D, B]`` (bfloat16, contiguous)."""
    dim = rows.shape[1]
    pd, kd = min(dim, PART), tile_count(dim)
    blocks = rows.to(torch.bfloat16).reshape(num_blocks, -1, kd, pd)
    return blocks.permute(0, 3, 2, 1).contiguous()


def from_kernel_blocks(blocks: Tensor) -> Tensor:
    """``[N, P_D, K_D, B]`` -> ``(N*B, D)`` rows."""
    n, pd, kd, b = blocks.shape
    return blocks.permute(0, 3, 2, 1).reshape(n * b, kd * pd)


def activations_from_kernel_blocks(act_blocks: Tensor) -> Tensor:
    """``[N, P_F, 2, K_F, B]`` -> ``(N*B, 2, F)``: row, gate (0) / up (1), feature."""
    n, pf, two, kf, b = act_blocks.shape
    return act_blocks.permute(0, 4, 2, 3, 1).reshape(n * b, two, kf * pf)


def weight_layout(w1: Tensor, w2: Tensor, w3: Tensor) -> tuple[Tensor, Tensor]:
    """torchtitan's ``w1_EFD``, ``w2_EDF``, ``w3_EFD`` -> (``gate_up [E, D, 2, F]``,
    ``down [E, F, D]``), bfloat16: the one per-call transpose of the weights (torchtitan keeps the
    contraction dimension contiguous; the kernels need it on partitions)."""
    bf = torch.bfloat16
    gate_up = torch.stack((w1.to(bf).transpose(-2, -1), w3.to(bf).transpose(-2, -1)), dim=2).contiguous()
    return gate_up, w2.to(bf).transpose(-2, -1).contiguous()


def weight_loads(block_expert: Tensor, num_experts: int, programs: int = PROGRAMS) -> Tensor:
    """``[N, 1]`` int32: ``block_expert[n]`` where block ``n`` starts a program's run or changes
    expert, else ``num_experts`` (keep the loaded weights). Tensor ops only."""
    ids = block_expert.reshape(-1).to(torch.int64)
    n = ids.shape[0]
    per = max(1, -(-n // programs))
    starts = torch.arange(n, device=ids.device) % per == 0
    changed = torch.ones_like(starts)
    changed[1:] = ids[1:] != ids[:-1]
    keep = torch.full_like(ids, num_experts)
    return torch.where(starts | changed, ids, keep).to(torch.int32).reshape(-1, 1)


def kernel_layout(x_blocked: Tensor, block_expert: Tensor, w1: Tensor, w2: Tensor, w3: Tensor,
                  programs: int = PROGRAMS):
    """Blocked op layout (``x_blocked (N*B, D)``, ``block_expert (N,)``, ``w1_EFD``, ``w2_EDF``,
    ``w3_EFD``) -> the kernel's arguments."""
    gate_up, down = weight_layout(w1, w2, w3)
    num_blocks = block_expert.shape[0]
    return to_kernel_blocks(x_blocked, num_blocks), weight_loads(block_expert, w1.shape[0], programs), gate_up, down


def grouped_swiglu_via(call, x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor,
                       programs: int = PROGRAMS) -> Tensor:
    """``harness::grouped_swiglu``'s blockwise path with ``call`` (kernel, emulated or simulated
    kernel, or twin) as the body: ``call(x_blocks, weight_load, gate_up, down) -> y_blocks``.
    ``offsets``: int32 cumulative rows per expert (runtime data)."""
    def body(x_blocked, block_expert, w1_, w2_, w3_):
        y_blocks = call(*kernel_layout(x_blocked, block_expert, w1_, w2_, w3_, programs))
        return from_kernel_blocks(torch.as_tensor(y_blocks))

    return grouped_swiglu_blockwise(x, offsets, w1, w2, w3, body)


# ------------------------------------------------------------------ the kernel


def _forward(x_blocks, weight_load, gate_up, down, checkpoint: bool):
    num_blocks, pd, kd, block = x_blocks.shape
    experts, dim, _, hidden = gate_up.shape
    kf, pf = tile_count(hidden), min(hidden, PART)
    assert pd * kd == dim and block <= MOVING_MAX, (f"x_blocks {x_blocks.shape} for D={dim}; "
                                                   f"block size must be <= {MOVING_MAX}")
    programs = nl.num_programs(axes=0) if nl.program_ndim() else 1
    program = nl.program_id(axis=0) if nl.program_ndim() else 0
    y_blocks = nl.ndarray((num_blocks, pd, kd, block), dtype=x_blocks.dtype, buffer=nl.shared_hbm)
    act_blocks = (nl.ndarray((num_blocks, pf, 2, kf, block), dtype=x_blocks.dtype, buffer=nl.shared_hbm)
                  if checkpoint else None)
    # the weights of the expert this program computes now: element (p, k, j) = gate_up[e, k*pd + p, j]
    # (j over gate then up), element (p, j, d) = down[e, j*pf + p, d]
    gate_up_sb = nl.ndarray((pd, kd, 2 * hidden), dtype=gate_up.dtype, buffer=nl.sbuf)
    down_sb = nl.ndarray((pf, kf, dim), dtype=down.dtype, buffer=nl.sbuf)
    for n in program_blocks(num_blocks, programs, program):
        load = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=load, src=weight_load[n : n + 1, 0:1])
        nisa.dma_copy(dst=gate_up_sb, src=gate_up.ap(pattern=[[2 * hidden, pd], [pd * 2 * hidden, kd], [1, 2 * hidden]],
                                                     offset=0, scalar_offset=load, indirect_dim=0),
                      oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=down_sb, src=down.ap(pattern=[[dim, pf], [pf * dim, kf], [1, dim]],
                                               offset=0, scalar_offset=load, indirect_dim=0),
                      oob_mode=nisa.oob_mode.skip)
        x_sb = nl.ndarray((pd, kd, block), dtype=x_blocks.dtype, buffer=nl.sbuf)
        block_rows = [[kd * block, pd], [block, kd], [1, block]]  # block n, each partition one contiguous run
        nisa.dma_copy(dst=x_sb, src=x_blocks.ap(pattern=block_rows, offset=n * pd * kd * block))
        h_sb = nl.ndarray((pf, kf, block), dtype=nl.bfloat16, buffer=nl.sbuf)
        act_sb = nl.ndarray((pf, 2, kf, block), dtype=nl.bfloat16, buffer=nl.sbuf) if checkpoint else None
        for j in range(kf):
            projections = []
            for g in range(2):  # gate, up
                f0 = g * hidden + j * pf
                acc = nl.ndarray((pf, block), dtype=nl.float32, buffer=nl.psum)
                for k in range(kd):
                    nisa.nc_matmul(dst=acc, stationary=gate_up_sb[:, k, f0 : f0 + pf], moving=x_sb[:, k, :],
                                   accumulate=(k > 0))
                rounded = (act_sb[:, g, j, :] if checkpoint
                           else nl.ndarray((pf, block), dtype=nl.bfloat16, buffer=nl.sbuf))
                nisa.tensor_copy(dst=rounded, src=acc)
                projections.append(rounded)
            act = nl.ndarray((pf, block), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.activation(dst=act, op=nl.silu, data=projections[0])
            nisa.tensor_tensor(dst=h_sb[:, j, :], data1=act, data2=projections[1], op=nl.multiply)
        y_sb = nl.ndarray((pd, kd, block), dtype=x_blocks.dtype, buffer=nl.sbuf)
        for k in range(kd):
            d0 = k * pd
            acc = nl.ndarray((pd, block), dtype=nl.float32, buffer=nl.psum)
            for j in range(kf):
                nisa.nc_matmul(dst=acc, stationary=down_sb[:, j, d0 : d0 + pd], moving=h_sb[:, j, :],
                               accumulate=(j > 0))
            nisa.tensor_copy(dst=y_sb[:, k, :], src=acc)
        nisa.dma_copy(dst=y_blocks.ap(pattern=block_rows, offset=n * pd * kd * block), src=y_sb)
        if checkpoint:
            nisa.dma_copy(dst=act_blocks.ap(pattern=[[2 * kf * block, pf], [kf * block, 2], [block, kf], [1, block]],
                                            offset=n * pf * 2 * kf * block), src=act_sb)
    return (y_blocks, act_blocks) if checkpoint else y_blocks


def grouped_swiglu_kernel(x_blocks, weight_load, gate_up, down):
    return _forward(x_blocks, weight_load, gate_up, down, checkpoint=False)


def grouped_swiglu_checkpoint_kernel(x_blocks, weight_load, gate_up, down):
    """The forward that also returns ``act_blocks`` (the backward's recompute)."""
    return _forward(x_blocks, weight_load, gate_up, down, checkpoint=True)


# The undecorated functions (their signatures are checked against the twins'; an emulator traces
# them); the kernels proper exist only with the real nki.
grouped_swiglu_kernel_source = grouped_swiglu_kernel
grouped_swiglu_checkpoint_kernel_source = grouped_swiglu_checkpoint_kernel
grouped_swiglu_kernel = nki.jit(grouped_swiglu_kernel_source) if nki is not None else None
grouped_swiglu_checkpoint_kernel = nki.jit(grouped_swiglu_checkpoint_kernel_source) if nki is not None else None


def launched(kernel, programs: int = PROGRAMS):
    """``kernel[programs]``: the LNC launch (Neuron 2.33, "Using Logical NeuronCores (LNC) with
    NKI": bracket syntax at the call site; a kernel's LNC must equal neuronx-cc's, NCC_EVRF066)."""
    return kernel[programs] if programs > 1 else kernel


def grouped_swiglu_simulated(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """CPU: the NKI kernel under ``nki.simulate`` pinned to trn2 (needs the real ``nki``)."""
    if grouped_swiglu_kernel is None:
        raise RuntimeError(f"nki is not available: {NKI_IMPORT_ERROR}")
    return grouped_swiglu_via(simulated(launched(grouped_swiglu_kernel)), x, offsets, w1, w2, w3)


def emulated(name: str, programs: int = PROGRAMS):
    """This module's kernel ``name`` on the harness's NKI emulator (device tier ``nki-emu``),
    launched on ``programs`` programs."""
    kernel = getattr(nki_emu.import_module(__name__), name)
    return nki_emu.run(kernel, grid=(programs,) if programs > 1 else ())


def grouped_swiglu_emulated(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """CPU: the kernel body on the harness's NKI emulator, two programs as on an LNC=2 core."""
    return grouped_swiglu_via(emulated("grouped_swiglu_kernel"), x, offsets, w1, w2, w3)


def grouped_swiglu_neuron(x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """The 'neuron' device kernel of ``harness::grouped_swiglu`` (registered by harness.kernels.ops.neuron).

    No host read of the routing: ``offsets``, ``block_expert`` and the load map stay device
    tensors; the kernel sees only shapes."""
    return grouped_swiglu_via(launched(grouped_swiglu_kernel), x, offsets, w1, w2, w3)

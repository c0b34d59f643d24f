"""NKI rotate-half RoPE forward kernel. NOT YET RUN ON HARDWARE OR IN THE SIMULATOR.

Contract (kernel and its torch twin ``rope_kernel_torch.rope_halves_kernel_torch_ref`` share it): six
``[half, N]`` arrays, head-dim half on the partition axis (``half = D/2 <= 128``) and the ``N = B*S*H``
rotated vectors on the free axis::

    o1 = x1*c1 - x2*s1          (first half:  x1*cos + (-x2)*sin)
    o2 = x2*c2 + x1*s2          (second half: x2*cos +   x1*sin)

computed in float32 and returned in ``x1``'s dtype -- the same expression, rounding points and
dtype policy as ``CosSinRoPE.apply_rotary_emb`` (negation is exact, so ``a + (-b) == a - b``).
Passing the halves as separate arrays keeps every elementwise instruction on partitions
``0..half``, so no cross-partition move is needed. At LNC=2 (``kernel[2]``) each program computes
a contiguous half of the free-axis tiles (``program_tiles``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.kernels import emu as nki_emu
from harness.kernels.ops.nki.simulation import as_torch, simulated
from harness.kernels.ops.rope import broadcast_cos_sin

try:  # the real Neuron SDK only; the PyPI placeholder raises ImportError("WRONG PACKAGE ...")
    import nki
    import nki.isa as nisa
    import nki.language as nl

    NKI_IMPORT_ERROR = None
except Exception as _error:
    nki = nisa = nl = None
    NKI_IMPORT_ERROR = f"{type(_error).__name__}: {_error}"

FREE_TILE = 512  # free-axis tile width (one PSUM bank of float32 is not needed here; SBUF-friendly)


def to_halves(x: Tensor, cos: Tensor, sin: Tensor):
    """``x (B,S,H,D)``, ``cos/sin`` broadcastable -> six contiguous ``[D/2, B*S*H]`` arrays."""
    half = x.shape[-1] // 2
    c = broadcast_cos_sin(cos, x).expand(x.shape)
    s = broadcast_cos_sin(sin, x).expand(x.shape)

    def split(t: Tensor):
        flat = t.reshape(-1, t.shape[-1])
        return flat[:, :half].t().contiguous(), flat[:, half:].t().contiguous()

    x1, x2 = split(x)
    c1, c2 = split(c.to(torch.float32))
    s1, s2 = split(s.to(torch.float32))
    return x1, x2, c1, c2, s1, s2


def from_halves(o1: Tensor, o2: Tensor, shape) -> Tensor:
    return torch.cat((o1.t(), o2.t()), dim=-1).reshape(shape)


def rope_via(call, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Run ``call`` (kernel, simulated kernel or reference) on ``x`` and reassemble (B,S,H,D)."""
    o1, o2 = as_torch(tuple(call(*to_halves(x, cos, sin))))
    return from_halves(o1, o2, x.shape).to(x.dtype)


PROGRAMS = 2  # LNC=2, trn2's default: the kernel is launched as kernel[PROGRAMS]


def program_tiles(n: int, programs: int, program: int) -> list[int]:
    """The start columns of the free-axis tiles program ``program`` of ``programs`` computes: a
    contiguous run, so the two cores of an LNC=2 launch share the work."""
    starts = list(range(0, n, FREE_TILE))
    per = -(-len(starts) // programs)
    return starts[program * per : (program + 1) * per]


def launched(kernel, programs: int = PROGRAMS):
    """``kernel[programs]``: the LNC launch (Neuron 2.33, "Using Logical NeuronCores (LNC) with
    NKI": bracket syntax at the call site; a kernel's LNC must equal neuronx-cc's, NCC_EVRF066)."""
    return kernel[programs] if programs > 1 else kernel


def rope_halves_kernel(x1, x2, c1, c2, s1, s2):
    half, n = x1.shape
    assert half <= nl.tile_size.pmax, f"head_dim/2={half} exceeds {nl.tile_size.pmax} partitions"
    o1 = nl.ndarray((half, n), dtype=x1.dtype, buffer=nl.shared_hbm)
    o2 = nl.ndarray((half, n), dtype=x1.dtype, buffer=nl.shared_hbm)
    programs = nl.num_programs(axes=0) if nl.program_ndim() else 1
    program = nl.program_id(axis=0) if nl.program_ndim() else 0
    for start in program_tiles(n, programs, program):
        width = min(FREE_TILE, n - start)
        tiles = []
        for src in (x1, x2, c1, c2, s1, s2):
            raw = nl.ndarray((half, width), dtype=src.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=raw, src=src[:, start : start + width])
            wide = nl.ndarray((half, width), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=wide, src=raw)
            tiles.append(wide)
        tx1, tx2, tc1, tc2, ts1, ts2 = tiles
        for out, a, ca, b, sb, op in ((o1, tx1, tc1, tx2, ts1, nl.subtract), (o2, tx2, tc2, tx1, ts2, nl.add)):
            p = nl.ndarray((half, width), dtype=nl.float32, buffer=nl.sbuf)
            q = nl.ndarray((half, width), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=p, data1=a, data2=ca, op=nl.multiply)
            nisa.tensor_tensor(dst=q, data1=b, data2=sb, op=nl.multiply)
            r = nl.ndarray((half, width), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=r, data1=p, data2=q, op=op)
            narrow = nl.ndarray((half, width), dtype=x1.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=narrow, src=r)
            nisa.dma_copy(dst=out[:, start : start + width], src=narrow)
    return o1, o2


# The undecorated function (its signature is checked against the twin's); the kernel proper
# exists only with the real nki.
rope_halves_kernel_source = rope_halves_kernel
rope_halves_kernel = nki.jit(rope_halves_kernel_source) if nki is not None else None


def rope_simulated(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """CPU: the NKI kernel under ``nki.simulate`` pinned to trn2 (needs the real ``nki``)."""
    if rope_halves_kernel is None:
        raise RuntimeError(f"nki is not available: {NKI_IMPORT_ERROR}")
    return rope_via(simulated(launched(rope_halves_kernel)), x, cos, sin)


def rope_emulated(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """CPU: the kernel body on the harness's NKI emulator (device tier ``nki-emu``), two programs
    as on an LNC=2 core."""
    module = nki_emu.import_module(__name__)
    return rope_via(nki_emu.run(module.rope_halves_kernel, grid=(PROGRAMS,)), x, cos, sin)


def rope_neuron(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The 'neuron' device kernel of ``harness::rope`` (registered by harness.kernels.ops.neuron), LNC=2."""
    return rope_via(launched(rope_halves_kernel), x, cos, sin)

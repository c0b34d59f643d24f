"""Torch twins of ``grouped_swiglu_kernel.grouped_swiglu_kernel`` and
``grouped_swiglu_checkpoint_kernel``: same arguments, the same blockwise layout (``x_blocks
[N, P_D, K_D, B]``, the load map ``weight_load``, nki-library's weight layout ``gate_up [E, D, 2,
F]`` / ``down [E, F, D]``), the same rounding points.

Computes in ``x_blocks``' dtype: each GEMM accumulates in ``promote(dtype, float32)`` and is
rounded to ``dtype`` where the kernel rounds (bfloat16 for the kernel's bfloat16 arguments;
float64 throughout when given float64). Zero rows give zero outputs. The load map is read as the
kernel reads it: ``E`` keeps the weights loaded last; the twin walks the blocks in order, so it
relies on the first block of each program loading (``grouped_swiglu_kernel.weight_loads`` makes
it so; the kernel would read unloaded weights otherwise). An id outside ``0 .. E`` raises, as the
kernel's DMA does, and so does a first block that keeps nothing.

``blocked_rows_torch_ref`` is the same computation on the op's blocked row layout
(``(N*B, D)`` rows, ``block_expert (N,)``, torchtitan's weights), for code that plants a defect
in the map (harness/plants/kernels.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _experts(weight_load: Tensor, num_experts: int) -> list[int]:
    """The expert each block computes with, following the load map."""
    experts, current = [], None
    for n, e in enumerate(int(v) for v in weight_load.reshape(-1).tolist()):
        if not 0 <= e <= num_experts:
            raise IndexError(f"weight_load[{n}] = {e} is neither an expert index 0..{num_experts - 1} "
                             f"nor {num_experts} (keep)")
        if e < num_experts:
            current = e
        elif current is None:
            raise IndexError(f"weight_load[{n}] = {num_experts} keeps weights no block loaded")
        experts.append(current)
    return experts


def _block(x_rows: Tensor, gate_up_e: Tensor, down_e: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(y, a, b) for one block's rows ``(B, D)``, rounded where the kernel rounds."""
    dtype = x_rows.dtype
    acc = torch.promote_types(dtype, torch.float32)
    a = (x_rows.to(acc) @ gate_up_e[:, 0, :].to(acc)).to(dtype)
    b = (x_rows.to(acc) @ gate_up_e[:, 1, :].to(acc)).to(dtype)
    h = F.silu(a) * b
    return (h.to(acc) @ down_e.to(acc)).to(dtype), a, b


def _forward(x_blocks: Tensor, weight_load: Tensor, gate_up: Tensor, down: Tensor):
    num_blocks, pd, kd, block = x_blocks.shape
    experts = _experts(weight_load, gate_up.shape[0])
    if len(experts) != num_blocks:
        raise ValueError(f"weight_load names {len(experts)} blocks, x_blocks holds {num_blocks}")
    hidden = gate_up.shape[-1]
    pf = min(hidden, 128)
    y_blocks = torch.zeros_like(x_blocks)
    act_blocks = torch.zeros(num_blocks, pf, 2, hidden // pf, block, dtype=x_blocks.dtype)
    for n, e in enumerate(experts):
        rows = x_blocks[n].permute(2, 1, 0).reshape(block, kd * pd)
        y, a, b = _block(rows, gate_up[e], down[e])
        y_blocks[n] = y.reshape(block, kd, pd).permute(2, 1, 0)
        act_blocks[n] = torch.stack((a, b), dim=1).reshape(block, 2, hidden // pf, pf).permute(3, 1, 2, 0)
    return y_blocks, act_blocks


def grouped_swiglu_kernel_torch_ref(x_blocks: Tensor, weight_load: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    return _forward(x_blocks, weight_load, gate_up, down)[0]


def grouped_swiglu_checkpoint_kernel_torch_ref(x_blocks: Tensor, weight_load: Tensor, gate_up: Tensor,
                                               down: Tensor) -> tuple[Tensor, Tensor]:
    return _forward(x_blocks, weight_load, gate_up, down)


def blocked_rows_torch_ref(x_blocked: Tensor, block_expert: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """The twin on the op's blocked rows (``(N*B, D)``, ``block_expert (N,)``, ``w1_EFD``,
    ``w2_EDF``, ``w3_EFD``), in ``x_blocked``'s dtype -> ``(N*B, D)``."""
    num_blocks = block_expert.shape[0]
    block = x_blocked.shape[0] // num_blocks if num_blocks else 0
    out = torch.zeros_like(x_blocked)
    gate_up = torch.stack((w1.transpose(-2, -1), w3.transpose(-2, -1)), dim=2).to(x_blocked.dtype)
    down = w2.transpose(-2, -1).to(x_blocked.dtype)
    for n, e in enumerate(int(v) for v in block_expert.reshape(-1).tolist()):
        if not 0 <= e < w1.shape[0]:
            raise IndexError(f"block_expert[{n}] = {e} is not an expert index 0..{w1.shape[0] - 1}")
        rows = slice(n * block, (n + 1) * block)
        out[rows] = _block(x_blocked[rows], gate_up[e], down[e])[0]
    return out

"""The blockwise MoE kernel fits the source's 64-expert shape: its cost at R = 8192 routed rows,
D = 2048, F = 768, E = 64 (harness/ops/nki/grouped_swiglu_cost.py, counted from the kernel's
loop structure), and that count equals the NKI emulator's trace of the kernel.

The bounds (the issue's, for the kernel at the block size it runs with):
- FLOPs at most 1.25x what the layer needs (2*3*R*D*F) for a balanced routing, and at most 2x
  for any routing. The trace is static (one compiled shape), so every routing costs the same
  N*B/R, with N = max_blocks(R, E, B) the proven worst case;
- at least 6x fewer instructions than the capacity-padded kernel it replaced (NKI 0.7 unrolls
  the loops, so the count is what the compiler must schedule);
- its HBM buffers fit in 1 GiB of a 24 GiB logical core (the replaced kernel's took 6.6 GiB).
"""

from __future__ import annotations

import pytest
import torch

from harness.ops import grouped_swiglu as gs
from harness.ops.nki import grouped_swiglu_cost as cost
from harness.ops.nki.grouped_swiglu_cost import SOURCE_SHAPE, blockwise_cost, capacity_padded_cost

BALANCED_FLOPS, WORST_FLOPS, INSTRUCTION_FACTOR, HBM_LIMIT = 1.25, 2.0, 6, 2**30


def cost_problems(kernel_cost, replaced) -> list[str]:
    problems = []
    if kernel_cost.flops_ratio > BALANCED_FLOPS:
        problems.append(f"FLOPs {kernel_cost.flops_ratio:.3f}x the layer's need > {BALANCED_FLOPS}x (balanced routing)")
    worst = cost.worst_case_flops_ratio_bound(kernel_cost.rows, kernel_cost.experts, kernel_cost.block_size)
    if kernel_cost.kernel != "blockwise" or kernel_cost.flops_ratio > worst or worst > WORST_FLOPS:
        problems.append(f"FLOPs {kernel_cost.flops_ratio:.3f}x not bounded by {WORST_FLOPS}x for every routing")
    if kernel_cost.total_instructions * INSTRUCTION_FACTOR > replaced.total_instructions:
        problems.append(f"{kernel_cost.total_instructions:,} instructions: not {INSTRUCTION_FACTOR}x fewer than "
                        f"the capacity-padded kernel's {replaced.total_instructions:,}")
    if kernel_cost.hbm_total_bytes > HBM_LIMIT:
        problems.append(f"HBM buffers {kernel_cost.hbm_total_bytes / 2**30:.2f} GiB > 1 GiB")
    return problems


def test_the_kernel_at_the_source_shape_keeps_every_bound():
    ours, replaced = blockwise_cost(**SOURCE_SHAPE), capacity_padded_cost(**SOURCE_SHAPE)
    assert ours.block_size == gs.BLOCK_SIZE and ours.blocks == gs.max_blocks(8192, 64, gs.BLOCK_SIZE)
    assert cost_problems(ours, replaced) == [], cost.report()


@pytest.mark.parametrize("kernel_cost", [
    capacity_padded_cost(**SOURCE_SHAPE),
    blockwise_cost(block_size=128, **SOURCE_SHAPE),  # 1.98x for every routing: over the balanced bound
    blockwise_cost(block_size=512, **SOURCE_SHAPE),  # 4.94x: over both
    blockwise_cost(block_size=8, **SOURCE_SHAPE),  # 1.05x FLOPs, but 360,720 instructions: only 1.8x fewer
], ids=["capacity_padded", "B128", "B512", "B8"])
def test_the_bounds_fail_other_designs(kernel_cost):
    assert cost_problems(kernel_cost, capacity_padded_cost(**SOURCE_SHAPE))


def test_the_replaced_kernel_cost_is_the_issue_estimate():
    """~660,000 instructions and 64x the FLOPs (issue 16), counted from its loop structure."""
    replaced = capacity_padded_cost(**SOURCE_SHAPE)
    assert replaced.total_instructions == 663_552 and replaced.flops_ratio == 64


# ------------------------------------------------------------------ the count is the kernel's


def _emulator():
    from harness import nki_emu

    return nki_emu, nki_emu.import_module("harness.ops.nki.grouped_swiglu_kernel")


def _kernel_args(nki_emu, rows, dim, hidden, experts, block_size=gs.BLOCK_SIZE):
    n = gs.max_blocks(rows, experts, block_size)
    return (nki_emu.meta((dim, n * block_size)), nki_emu.meta((n, 1), torch.int32), nki_emu.meta((experts, dim, hidden)),
            nki_emu.meta((experts, dim, hidden)), nki_emu.meta((experts, hidden, dim)))


def _matches(analytic, report) -> list[str]:
    pairs = {"instructions by kind": (analytic.instructions, dict(report.opcodes)),
             "DMA bytes": (analytic.dma_bytes, report.dma_bytes),
             "matmul FLOPs": (analytic.matmul_flops, report.matmul_flops)}
    return [f"{name}: analytic {a} != emulator {b}" for name, (a, b) in pairs.items() if a != b]


@pytest.mark.parametrize("shape", [
    {"rows": 52, "dim": 256, "hidden": 384, "experts": 4},
    {"rows": 9, "dim": 64, "hidden": 32, "experts": 3},
], ids=["tiled", "untiled"])
def test_cost_model_equals_the_emulator_trace_of_the_kernel(shape):
    """A shape-only trace (no numerics) of the kernel on the emulator counts what the cost
    model counts: instructions by kind, DMA bytes, matmul FLOPs."""
    nki_emu, gk = _emulator()
    _, report = nki_emu.trace(gk.grouped_swiglu_kernel, numerics=False)(*_kernel_args(nki_emu, **shape))
    assert _matches(blockwise_cost(**shape), report) == []


def test_cost_comparison_catches_a_miscounted_loop():
    """The equality above can fail: a model that forgets the expert-id load of each block."""
    nki_emu, gk = _emulator()
    shape = {"rows": 9, "dim": 64, "hidden": 32, "experts": 3}
    _, report = nki_emu.trace(gk.grouped_swiglu_kernel, numerics=False)(*_kernel_args(nki_emu, **shape))
    right = blockwise_cost(**shape)
    wrong = type(right)(**{**right.__dict__, "instructions": {**right.instructions,
                                                               "dma_copy": right.instructions["dma_copy"] - right.blocks}})
    assert _matches(wrong, report)

"""The blockwise MoE kernel fits the source's 64-expert shape: its cost at R = 8192 routed rows,
D = 2048, F = 768, E = 64 (harness/kernels/ops/nki/grouped_swiglu_cost.py, counted from the kernel's
loop structure), and that count equals the NKI emulator's trace of the kernel.

The bounds (the issue's, for the kernel at the block size it runs with):
- FLOPs at most 1.25x what the layer needs (2*3*R*D*F) for a balanced routing, and at most 2x
  for any routing. The trace is static (one compiled shape), so every routing costs the same
  N*B/R, with N = max_blocks(R, E, B) the proven worst case;
- at least 6x fewer instructions than the capacity-padded kernel it replaced (NKI 0.7 unrolls
  the loops, so the count is what the compiler must schedule);
- its HBM buffers fit in 1 GiB of a 24 GiB logical core (the capacity-padded kernel's took 6.6 GiB);
- the blocks split across the two programs of an LNC=2 core (each core issues at most half the
  instructions, rounded up to a block), and the weights move at most once per expert per program
  for every routing: E + 1 loads, 0.61 GB (the kernel before reloaded every block: 3.0 GB).
"""

from __future__ import annotations

import pytest
import torch

from harness.kernels import emu as nki_emu
from harness.kernels.ops import grouped_swiglu as gs
from harness.kernels.ops.nki import grouped_swiglu_cost as cost
from harness.kernels.ops.nki import grouped_swiglu_kernel as gk
from harness.kernels.ops.nki import moe_cost_table
from harness.kernels.ops.nki.grouped_swiglu_cost import (
    SOURCE_SHAPE,
    blockwise_cost,
    capacity_padded_cost,
    previous_blockwise_cost,
)
from harness.kernels.ops.nki.moe_cost_table import Row
from harness.registry import upstream

BALANCED_FLOPS, WORST_FLOPS, INSTRUCTION_FACTOR, HBM_LIMIT = 1.25, 2.0, 6, 2**30


def cost_problems(kernel_cost, replaced) -> list[str]:
    problems = []
    if kernel_cost.flops_ratio > BALANCED_FLOPS:
        problems.append(f"FLOPs {kernel_cost.flops_ratio:.3f}x the layer's need > {BALANCED_FLOPS}x (balanced routing)")
    worst = cost.worst_case_flops_ratio_bound(kernel_cost.rows, kernel_cost.experts, kernel_cost.block_size)
    if not kernel_cost.kernel.startswith("blockwise") or kernel_cost.flops_ratio > worst or worst > WORST_FLOPS:
        problems.append(f"FLOPs {kernel_cost.flops_ratio:.3f}x not bounded by {WORST_FLOPS}x for every routing")
    if kernel_cost.total_instructions * INSTRUCTION_FACTOR > replaced.total_instructions:
        problems.append(f"{kernel_cost.total_instructions:,} instructions: not {INSTRUCTION_FACTOR}x fewer than "
                        f"the capacity-padded kernel's {replaced.total_instructions:,}")
    if kernel_cost.hbm_total_bytes > HBM_LIMIT:
        problems.append(f"HBM buffers {kernel_cost.hbm_total_bytes / 2**30:.2f} GiB > 1 GiB")
    per_core = -(-kernel_cost.blocks // gk.PROGRAMS) * kernel_cost.total_instructions // kernel_cost.blocks
    if kernel_cost.critical_instructions > per_core:
        problems.append(f"one core issues {kernel_cost.critical_instructions:,} of {kernel_cost.total_instructions:,} "
                        f"instructions: the blocks are not split across the {gk.PROGRAMS} programs")
    loads = (kernel_cost.weight_dma_bytes_moved or kernel_cost.weight_dma_bytes) // (
        3 * kernel_cost.dim * kernel_cost.hidden * cost.BF16)
    if loads > kernel_cost.experts + gk.PROGRAMS - 1:
        problems.append(f"{loads} expert weight loads for the worst routing > E + {gk.PROGRAMS - 1} "
                        f"(once per expert per program)")
    return problems


def test_the_kernel_at_the_source_shape_keeps_every_bound():
    ours, replaced = blockwise_cost(**SOURCE_SHAPE), capacity_padded_cost(**SOURCE_SHAPE)
    assert ours.block_size == gs.BLOCK_SIZE and ours.blocks == gs.max_blocks(8192, 64, gs.BLOCK_SIZE)
    assert cost_problems(ours, replaced) == [], cost.report()
    assert ours.weight_dma_bytes_moved == 65 * 3 * 2048 * 768 * 2  # 0.61 GB


@pytest.mark.parametrize("kernel_cost", [
    capacity_padded_cost(**SOURCE_SHAPE),
    previous_blockwise_cost(**SOURCE_SHAPE),  # every block reloads its weights; one core runs all blocks
    blockwise_cost(programs=1, **SOURCE_SHAPE),  # no program split
    blockwise_cost(block_size=128, **SOURCE_SHAPE),  # 1.98x for every routing: over the balanced bound
    blockwise_cost(block_size=512, **SOURCE_SHAPE),  # 4.94x: over both
    blockwise_cost(block_size=8, **SOURCE_SHAPE),  # 1.05x FLOPs, but 360,720 instructions: only 1.8x fewer
], ids=["capacity_padded", "reload_per_block", "one_program", "B128", "B512", "B8"])
def test_the_bounds_fail_other_designs(kernel_cost):
    assert cost_problems(kernel_cost, capacity_padded_cost(**SOURCE_SHAPE))


def test_the_capacity_padded_kernel_costs_660k_instructions_and_64x_the_flops():
    """The capacity-padded kernel the blockwise one replaced: ~660,000 instructions and 64x the
    FLOPs, counted from its loop structure."""
    replaced = capacity_padded_cost(**SOURCE_SHAPE)
    assert replaced.total_instructions == 663_552 and replaced.flops_ratio == 64


# ------------------------------------------------------------------ the count is the kernel's


def _emulator():
    return nki_emu, nki_emu.import_module("harness.kernels.ops.nki.grouped_swiglu_kernel")


def _kernel_args(nki_emu, rows, dim, hidden, experts, block_size=gs.BLOCK_SIZE):
    n = gs.max_blocks(rows, experts, block_size)
    return (nki_emu.meta((n, min(dim, 128), gk.tile_count(dim), block_size)), nki_emu.meta((n, 1), torch.int32),
            nki_emu.meta((experts, dim, 2, hidden)), nki_emu.meta((experts, hidden, dim)))


def _matches(analytic, report) -> list[str]:
    pairs = {"instructions by kind": (analytic.instructions, dict(report.opcodes)),
             "DMA bytes issued": (analytic.dma_bytes, report.dma_bytes),
             "matmul FLOPs": (analytic.matmul_flops, report.matmul_flops),
             "programs": (analytic.programs, report.programs)}
    return [f"{name}: analytic {a} != emulator {b}" for name, (a, b) in pairs.items() if a != b]


@pytest.mark.parametrize("shape", [
    {"rows": 52, "dim": 256, "hidden": 384, "experts": 4},
    {"rows": 9, "dim": 64, "hidden": 32, "experts": 3},
], ids=["tiled", "untiled"])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["forward", "checkpoint"])
def test_cost_model_equals_the_emulator_trace_of_the_kernel(shape, checkpoint):
    """A shape-only trace (no numerics) of the kernel on two programs counts what the cost model
    counts: instructions by kind, DMA bytes issued, matmul FLOPs."""
    nki_emu, module = _emulator()
    kernel = module.grouped_swiglu_checkpoint_kernel if checkpoint else module.grouped_swiglu_kernel
    _, report = nki_emu.trace(kernel, numerics=False, grid=(gk.PROGRAMS,))(*_kernel_args(nki_emu, **shape))
    assert _matches(blockwise_cost(checkpoint=checkpoint, **shape), report) == []


def test_cost_comparison_catches_a_miscounted_loop():
    """The equality above can fail: a model that forgets the load-map read of each block."""
    nki_emu, module = _emulator()
    shape = {"rows": 9, "dim": 64, "hidden": 32, "experts": 3}
    _, report = nki_emu.trace(module.grouped_swiglu_kernel, numerics=False, grid=(gk.PROGRAMS,))(
        *_kernel_args(nki_emu, **shape))
    right = blockwise_cost(**shape)
    fewer_dmas = {**right.instructions, "dma_copy": right.instructions["dma_copy"] - right.blocks}
    wrong = type(right)(**{**right.__dict__, "instructions": fewer_dmas})
    assert _matches(wrong, report)


def _routed_args(counts, dim=256, hidden=128, programs=gk.PROGRAMS, seed=0):
    g = torch.Generator().manual_seed(seed)
    experts, rows = len(counts), sum(counts)
    x = torch.randn(rows, dim, generator=g).bfloat16()
    w1, w3 = (torch.randn(experts, hidden, dim, generator=g).mul(0.05).bfloat16() for _ in range(2))
    w2 = torch.randn(experts, dim, hidden, generator=g).mul(0.05).bfloat16()
    slots, block_expert = gs.block_layout(torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32), rows)
    x_blocked = gs.to_blocks(x, slots, block_expert.shape[0] * gs.BLOCK_SIZE)
    return gk.kernel_layout(x_blocked, block_expert, w1, w2, w3, programs)


def weight_traffic_problems(counts, weight_load, report) -> list[str]:
    """Where the emulator's moved bytes differ from the cost model's for this load map, or the
    map loads an expert more than once per program (more than E + 1 loads on two programs)."""
    experts, shape = len(counts), {"rows": sum(counts), "dim": 256, "hidden": 128, "experts": len(counts)}
    analytic = blockwise_cost(**shape)
    weights = cost.weight_bytes_moved(weight_load, 256, 128, experts)
    problems = []
    if report.dma_bytes_moved != analytic.dma_bytes - analytic.weight_dma_bytes + weights:
        problems.append(f"emulator moved {report.dma_bytes_moved} B, the model says "
                        f"{analytic.dma_bytes - analytic.weight_dma_bytes + weights}")
    if weights > analytic.weight_dma_bytes_moved:
        problems.append(f"{int((weight_load < experts).sum())} expert loads > E + {gk.PROGRAMS - 1}")
    return problems


@pytest.mark.parametrize("counts", [(70, 3, 0, 90), (0, 200, 0, 0), (1, 1, 1, 1)], ids=["mixed", "one_expert", "ones"])
def test_weights_move_once_per_expert_per_program(counts):
    """With numerics the emulator moves a weight DMA's bytes only when the load map loads
    (``oob_mode.skip`` otherwise): the bytes moved are the cost model's per-load bytes times the
    map's loads, at most E + 1 on two programs."""
    nki_emu, module = _emulator()
    args = _routed_args(counts)
    _, report = nki_emu.trace(module.grouped_swiglu_kernel, grid=(gk.PROGRAMS,))(*args)
    assert weight_traffic_problems(counts, args[1], report) == []


def test_weight_traffic_check_catches_a_map_that_loads_every_block():
    """The bound above can fail: the load map of the kernel before, every block loading."""
    nki_emu, module = _emulator()
    counts = (70, 3, 0, 90)
    args = _routed_args(counts)
    _, block_expert = gs.block_layout(torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32), sum(counts))
    every = block_expert.reshape(-1, 1).clone()
    _, report = nki_emu.trace(module.grouped_swiglu_kernel, grid=(gk.PROGRAMS,))(args[0], every, *args[2:])
    assert weight_traffic_problems(counts, every, report)


def test_the_blocks_split_across_the_two_programs_without_repeating_work():
    """The emulator's trace on two programs counts exactly the one-program trace's instructions:
    each block is computed by one program (at LNC=2 the kernel before ran every block on both)."""
    nki_emu, module = _emulator()
    shape = {"rows": 52, "dim": 256, "hidden": 384, "experts": 4}
    reports = [nki_emu.trace(module.grouped_swiglu_kernel, numerics=False, grid=grid)(
        *_kernel_args(nki_emu, **shape))[1] for grid in ((), (gk.PROGRAMS,))]
    assert reports[1].programs == gk.PROGRAMS and reports[0].opcodes == reports[1].opcodes
    n = gs.max_blocks(52, 4, gs.BLOCK_SIZE)
    split = [gk.program_blocks(n, gk.PROGRAMS, p) for p in range(gk.PROGRAMS)]
    assert sorted(b for r in split for b in r) == list(range(n)) and max(map(len, split)) == -(-n // gk.PROGRAMS)


def test_the_split_check_catches_programs_that_each_run_every_block(monkeypatch):
    """The equality above can fail: every program walking all the blocks (the kernel before)."""
    nki_emu, module = _emulator()
    monkeypatch.setattr(module, "program_blocks", lambda n, programs, program: range(n))
    shape = {"rows": 52, "dim": 256, "hidden": 384, "experts": 4}
    one, two = (nki_emu.trace(module.grouped_swiglu_kernel, numerics=False, grid=grid)(
        *_kernel_args(nki_emu, **shape))[1] for grid in ((), (gk.PROGRAMS,)))
    assert one.opcodes != two.opcodes


# ------------------------------------------------------------------ the cost table: ours and nki-library's


def decision_problems(rows) -> list[str]:
    """The facts the choice of our forward for the neuron path rests on (harness/kernels/ops/nki/
    moe_cost_table.py): fewer FLOPs, fewer DMA bytes moved and less SBUF than nki-library's
    forward, at most half of its own kernel-before's instructions per core; and the backward row
    is the sum of its parts."""
    by_name = {r.name: r for r in rows}
    ours, library = by_name["ours"], by_name["nki-library bwmm_shard_on_block"]
    problems = []
    if not ours.matmul_flops < library.matmul_flops:
        problems.append(f"FLOPs: ours {ours.matmul_flops:.3g} >= nki-library's {library.matmul_flops:.3g}")
    if not ours.dma_bytes_moved < library.dma_bytes:
        problems.append(f"DMA: ours moves {ours.dma_bytes_moved:.3g} B >= nki-library's {library.dma_bytes:.3g}")
    if not ours.peak_sbuf < library.peak_sbuf:
        problems.append(f"SBUF: ours {ours.peak_sbuf} >= nki-library's {library.peak_sbuf} B/partition")
    before = [r for r in rows if r.name.startswith("ours before")]
    if before and not 2 * ours.busiest_program_instructions <= before[0].busiest_program_instructions:
        problems.append("ours issues more than half of the kernel-before's instructions per core")
    parts, total = [r for r in rows if r.direction == "backward"][:-1], rows[-1]
    if (total.matmul_flops != sum(r.matmul_flops for r in parts)
            or total.instructions != sum(r.instructions for r in parts)):
        problems.append("the backward total is not the sum of its parts")
    return problems


@pytest.mark.skipif(bool(upstream.missing("nki-library")), reason=str(upstream.missing("nki-library")))
def test_the_cost_table_at_a_small_shape_holds_every_kernel_and_matches_the_model():
    """The cheap form of the full-size table: every row traced, ours equal to the cost model."""
    shape = {"rows": 100, "dim": 256, "hidden": 128, "experts": 4}
    rows = moe_cost_table.trace_rows(shape)
    assert [(r.direction, r.name.split(" (")[0]) for r in rows] == [
        ("forward", "ours"), ("forward", "ours before"), ("forward", "nki-library bwmm_shard_on_block"),
        ("backward", "ours: recompute"), ("backward", "nki-library blockwise_mm_bwd"), ("backward", "ours: total")]
    analytic = blockwise_cost(**shape)
    assert (rows[0].instructions, rows[0].matmul_flops, rows[0].dma_bytes) == (
        analytic.total_instructions, analytic.matmul_flops, analytic.dma_bytes)
    assert "| forward | ours | 32 |" in moe_cost_table.markdown(rows, shape)


@pytest.mark.slow
@pytest.mark.skipif(bool(upstream.missing("nki-library")), reason=str(upstream.missing("nki-library")))
def test_at_the_30b_a3b_cut_our_forward_beats_nki_librarys_on_flops_dma_and_sbuf():
    """Shape-only traces at the cut (about 4 minutes of one core, nki-library's backward most)."""
    rows = moe_cost_table.trace_rows()
    assert decision_problems(rows) == [], moe_cost_table.markdown(rows)


def test_the_decision_check_fails_where_nki_librarys_forward_would_win():
    """The facts above can fail: the same table with our forward at B = 128 (1.98x FLOPs, as
    nki-library's) does not beat it on FLOPs."""
    def row(name, flops, dma, sbuf, direction="forward", instructions=10):
        return Row(direction, name, 32, 2, flops, 1, instructions, instructions, dma, dma, sbuf, 0, 0.0)

    ours_b128 = [row("ours", 153, 1, 1), row("nki-library bwmm_shard_on_block", 153, 2, 2),
                 row("a", 1, 1, 1, "backward"), row("total", 1, 1, 1, "backward")]
    assert decision_problems(ours_b128) == ["FLOPs: ours 153 >= nki-library's 153"]

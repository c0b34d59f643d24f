"""Cost of the grouped SwiGLU NKI kernel, counted from its loop structure (no trace needed).

``blockwise_cost`` counts what ``grouped_swiglu_kernel.grouped_swiglu_kernel`` issues: NKI 0.7
unrolls its Python loops while tracing, so every loop trip is instructions in the compiled
kernel. Two DMA counts: *issued* (every weight DMA as if it moved its bytes: what a shape-only
trace counts) and *moved* for the worst routing: a weight DMA of a block that keeps its
program's weights (load map entry ``E``, ``oob_mode.skip``) moves nothing, and each program
loads each expert of its run of blocks once, so at most ``E + P - 1`` expert loads for ``P``
programs whatever the routing. ``previous_blockwise_cost`` counts the kernel it replaced (the
same blocks, every block reloading all three weights, no program split: both LNC=2 cores ran it
whole; harness history up to commit bc9d5d3) and ``capacity_padded_cost`` the one before that
(every expert padded to ``R`` rows; up to d763245), for the side-by-side report.
tests/kernels/test_moe_blockwise_cost.py checks the counts against the emulator's cost report
(shape-only and with numerics) and keeps the full-shape bounds; ``python3 -m
harness.kernels.ops.nki.grouped_swiglu_cost`` prints the table; scripts/moe_kernel_cost.py adds the
emulator's traces, nki-library's kernels and the backward.

Instruction kinds and the engine each runs on: ``nc_matmul`` (Tensor Engine), ``activation``
(Scalar Engine), ``tensor_copy`` and ``tensor_tensor`` (Vector Engine unless the compiler moves
them), ``dma_copy`` (DMA queues). FLOPs are the matmuls' ``2*K*M*N``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.kernels.ops.grouped_swiglu import BLOCK_SIZE, max_blocks
from harness.kernels.ops.nki.grouped_swiglu_kernel import MOVING_MAX, PART, PROGRAMS, program_blocks, tile_count

BF16, F32, I32 = 2, 4, 4  # bytes per element

# The source's 30B-A3B cut, per rank: local batch 1 x seq 2048 tokens x top-4 routed rows,
# hidden 2048, moe_intermediate 768, 64 experts.
SOURCE_SHAPE = {"rows": 2048 * 4, "dim": 2048, "hidden": 768, "experts": 64}


@dataclass(frozen=True)
class KernelCost:
    kernel: str
    rows: int  # R, the routed rows the layer needs
    dim: int
    hidden: int
    experts: int
    block_size: int  # B (the replaced kernel: its 512-column chunk)
    blocks: int  # trips of the outer loop, all programs
    computed_rows: int  # columns the kernel computes (N*B; E*R for the capacity-padded kernel)
    instructions: dict[str, int]  # by instruction kind, all programs
    dma_bytes: int  # bytes dma_copy instructions address (HBM <-> SBUF), every weight DMA counted
    weight_dma_bytes: int  # of which expert weights
    matmul_flops: int
    sbuf_bytes_per_partition: int  # live SBUF of one loop trip
    psum_bytes_per_partition: int  # largest PSUM accumulator
    hbm_bytes: dict[str, int] = field(default_factory=dict)  # HBM buffers of one call
    programs: int = 1  # LNC programs the blocks are split over (1: every core runs them all)
    weight_dma_bytes_moved: int | None = None  # weight bytes really moved, worst routing (None: = issued)
    critical_blocks: int = 0  # blocks of the busiest program

    @property
    def total_instructions(self) -> int:
        return sum(self.instructions.values())

    @property
    def critical_instructions(self) -> int:
        """Instructions of the busiest program: what one core issues."""
        return self.total_instructions * self.critical_blocks // self.blocks if self.blocks else 0

    @property
    def dma_bytes_moved(self) -> int:
        """DMA bytes moved for the worst routing."""
        moved = self.weight_dma_bytes if self.weight_dma_bytes_moved is None else self.weight_dma_bytes_moved
        return self.dma_bytes - self.weight_dma_bytes + moved

    @property
    def needed_flops(self) -> int:
        """What the layer needs: three GEMMs of R rows, ``2 * 3 * R * D * F``."""
        return needed_flops(self.rows, self.dim, self.hidden)

    @property
    def flops_ratio(self) -> float:
        return self.matmul_flops / self.needed_flops

    @property
    def hbm_total_bytes(self) -> int:
        return sum(self.hbm_bytes.values())


def needed_flops(rows: int, dim: int, hidden: int) -> int:
    return 2 * 3 * rows * dim * hidden


def _weights_hbm(experts: int, dim: int, hidden: int) -> int:
    return 3 * experts * dim * hidden * BF16  # the weights' kernel-layout copy made per call


def _compute_per_block(kd: int, kf: int) -> dict[str, int]:
    return {
        "nc_matmul": 2 * kf * kd + kd * kf,  # gate and up over D tiles per F tile; down over F tiles per D tile
        "tensor_copy": 2 * kf + kd,  # PSUM -> SBUF bfloat16: gate, up per F tile; y per D tile
        "activation": kf,  # silu per F tile
        "tensor_tensor": kf,  # silu(a) * b per F tile
    }


def _check_block_size(block_size: int) -> None:
    if not 1 <= block_size <= MOVING_MAX:
        raise ValueError(f"block_size {block_size} must be in 1..{MOVING_MAX} (nc_matmul moving free size)")


def most_weight_loads(num_blocks: int, experts: int, programs: int) -> int:
    """The most expert loads any routing costs: blocks are sorted by expert and each program
    walks a contiguous run of them, loading on every change of expert, so the runs number at
    most ``E`` plus one per cut between programs (and never more than the blocks)."""
    return min(num_blocks, experts + programs - 1)


def blockwise_cost(rows: int, dim: int, hidden: int, experts: int, block_size: int = BLOCK_SIZE,
                   programs: int = PROGRAMS, checkpoint: bool = False) -> KernelCost:
    """The blockwise kernel (or its checkpoint variant) at ``N = max_blocks(R, E, B)`` blocks on
    ``programs`` programs. The trace is the same for every routing, so the instruction count
    and FLOPs are those of every routing; the moved weight bytes are the worst routing's."""
    _check_block_size(block_size)
    kd, kf = tile_count(dim), tile_count(hidden)
    n = max_blocks(rows, experts, block_size)
    per_block = {"dma_copy": 1 + 2 + 1 + 1 + int(checkpoint), **_compute_per_block(kd, kf)}
    weight_bytes = 3 * dim * hidden * BF16
    act_bytes = 2 * hidden * block_size * BF16 if checkpoint else 0
    block_dma = I32 + weight_bytes + 2 * dim * block_size * BF16 + act_bytes
    slots = n * block_size
    sbuf = (kd * 2 * hidden + kf * dim) * BF16 + (kd + kf + kd) * block_size * BF16 + 2 * block_size * BF16 + I32
    sbuf += 2 * kf * block_size * BF16 if checkpoint else 0
    hbm = {"x_blocked": slots * dim * BF16, "x_blocks": slots * dim * BF16, "weight_load": n * I32,
           "weights_kernel_layout": _weights_hbm(experts, dim, hidden), "y_blocks": slots * dim * BF16}
    if checkpoint:
        hbm["act_blocks"] = slots * 2 * hidden * BF16
    busiest = max((len(program_blocks(n, programs, p)) for p in range(programs)), default=0)
    return KernelCost(
        kernel="blockwise_checkpoint" if checkpoint else "blockwise", rows=rows, dim=dim, hidden=hidden,
        experts=experts, block_size=block_size, blocks=n, computed_rows=slots,
        instructions={kind: count * n for kind, count in per_block.items()},
        dma_bytes=n * block_dma, weight_dma_bytes=n * weight_bytes,
        matmul_flops=n * 2 * 3 * dim * hidden * block_size,
        sbuf_bytes_per_partition=sbuf, psum_bytes_per_partition=block_size * F32, hbm_bytes=hbm, programs=programs,
        weight_dma_bytes_moved=most_weight_loads(n, experts, programs) * weight_bytes, critical_blocks=busiest,
    )


def weight_bytes_moved(weight_load, dim: int, hidden: int, experts: int) -> int:
    """The weight bytes the kernel moves for one load map (entries ``< E`` load)."""
    return int((weight_load.reshape(-1) < experts).sum()) * 3 * dim * hidden * BF16


def previous_blockwise_cost(rows: int, dim: int, hidden: int, experts: int, block_size: int = BLOCK_SIZE) -> KernelCost:
    """The kernel this one replaced (up to commit bc9d5d3): the same blocks, each reloading its
    expert's three weights (one DMA each), no program split (at LNC=2 both cores ran it all)."""
    _check_block_size(block_size)
    kd, kf = tile_count(dim), tile_count(hidden)
    n = max_blocks(rows, experts, block_size)
    per_block = {"dma_copy": 1 + 3 + 1 + 1, **_compute_per_block(kd, kf)}
    weight_bytes = 3 * dim * hidden * BF16
    slots = n * block_size
    sbuf = (2 * kd * hidden + kf * dim) * BF16 + (2 * kd + kf) * block_size * BF16 + 3 * block_size * BF16
    return KernelCost(
        kernel="blockwise_reload_per_block", rows=rows, dim=dim, hidden=hidden, experts=experts,
        block_size=block_size, blocks=n, computed_rows=slots,
        instructions={kind: count * n for kind, count in per_block.items()},
        dma_bytes=n * (I32 + weight_bytes + 2 * dim * block_size * BF16), weight_dma_bytes=n * weight_bytes,
        matmul_flops=n * 2 * 3 * dim * hidden * block_size,
        sbuf_bytes_per_partition=sbuf, psum_bytes_per_partition=block_size * F32,
        hbm_bytes={"x_blocked": slots * dim * BF16, "xT": slots * dim * BF16, "block_expert": n * I32,
                   "weights_transposed": _weights_hbm(experts, dim, hidden), "yT": slots * dim * BF16},
        critical_blocks=n,
    )


def capacity_padded_cost(rows: int, dim: int, hidden: int, experts: int) -> KernelCost:
    """The replaced kernel: every expert padded to ``C = R`` columns, processed in chunks of up to
    512 columns; per chunk it loaded the chunk's rows per D tile, one 128x128 weight tile per
    matmul, and stored per D tile."""
    kd, kf = tile_count(dim), tile_count(hidden)
    capacity = rows
    chunks = [min(MOVING_MAX, capacity - r0) for r0 in range(0, capacity, MOVING_MAX)]
    per_chunk = {
        "dma_copy": kd + 2 * kf * kd + kd * kf + kd,
        "nc_matmul": 2 * kf * kd + kd * kf,
        "tensor_copy": 2 * kf + kd,
        "activation": kf,
        "tensor_tensor": kf,
    }
    count = experts * len(chunks)
    columns = experts * capacity
    weight_bytes = 3 * dim * hidden * BF16
    widest = chunks[0] if chunks else 0
    return KernelCost(
        kernel="capacity_padded", rows=rows, dim=dim, hidden=hidden, experts=experts, block_size=widest, blocks=count,
        computed_rows=columns,
        instructions={kind: c * count for kind, c in per_chunk.items()},
        dma_bytes=count * weight_bytes + 2 * columns * dim * BF16, weight_dma_bytes=count * weight_bytes,
        matmul_flops=2 * 3 * dim * hidden * columns,
        sbuf_bytes_per_partition=(kd + kf + 3) * widest * BF16 + 2 * PART * BF16,
        psum_bytes_per_partition=widest * F32,
        hbm_bytes={
            "x_padded": columns * dim * BF16, "xT": columns * dim * BF16,
            "weights_transposed": _weights_hbm(experts, dim, hidden), "yT": columns * dim * BF16,
        },
        critical_blocks=count,
    )


def block_size_table(block_sizes=(16, 32, 64, 128, 256, 512), shape=None) -> list[KernelCost]:
    shape = shape or SOURCE_SHAPE
    return [blockwise_cost(block_size=b, **shape) for b in block_sizes]


def _row(cost: KernelCost) -> str:
    gib = cost.hbm_total_bytes / 2**30
    return (f"| {cost.kernel} | {cost.block_size} | {cost.programs} | {cost.blocks} | {cost.computed_rows} | "
            f"{cost.flops_ratio:.3f} | {cost.total_instructions:,} | {cost.critical_instructions:,} | "
            f"{cost.instructions['nc_matmul']:,} | {cost.dma_bytes / 1e9:.2f} | {cost.dma_bytes_moved / 1e9:.2f} | "
            f"{(cost.weight_dma_bytes_moved or cost.weight_dma_bytes) / 1e9:.2f} | {gib:.2f} |")


def report(shape=None) -> str:
    shape = shape or SOURCE_SHAPE
    lines = [
        f"Shape: R={shape['rows']} rows, D={shape['dim']}, F={shape['hidden']}, E={shape['experts']}, bfloat16; "
        f"the layer needs {needed_flops(shape['rows'], shape['dim'], shape['hidden']) / 1e9:.1f} GFLOP.",
        "",
        "| kernel | B | programs | loop trips | computed rows | FLOPs / needed (every routing) | instructions "
        "| per core | matmuls | DMA GB issued | DMA GB moved (worst routing) | weight GB moved | HBM GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        _row(capacity_padded_cost(**shape)),
        _row(previous_blockwise_cost(**shape)),
    ]
    lines += [_row(cost) for cost in block_size_table(shape=shape)]
    return "\n".join(lines)


def worst_case_flops_ratio_bound(rows: int, experts: int, block_size: int) -> float:
    """``N*B/R <= 1 + E*(B-1)/R`` (from ``max_blocks``), independent of D and F."""
    return 1 + experts * (block_size - 1) / rows if rows else math.inf


if __name__ == "__main__":
    print(report())

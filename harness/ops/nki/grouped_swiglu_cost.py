"""Cost of the grouped SwiGLU NKI kernel, counted from its loop structure (no trace needed).

``blockwise_cost`` counts what ``grouped_swiglu_kernel.grouped_swiglu_kernel`` issues: NKI 0.7
unrolls its Python loops while tracing, so every loop trip is instructions in the compiled
kernel. ``capacity_padded_cost`` counts the kernel it replaced (every expert padded to ``R``
rows, columns in chunks of 512; harness history up to commit d763245), for the side-by-side
report. tests/kernels/test_moe_blockwise_cost.py checks the counts against the emulator's
cost report at a small shape and keeps the full-shape bounds; ``python3 -m
harness.ops.nki.grouped_swiglu_cost`` prints the table.

Instruction kinds and the engine each runs on: ``nc_matmul`` (Tensor Engine), ``activation``
(Scalar Engine), ``tensor_copy`` and ``tensor_tensor`` (Vector Engine unless the compiler moves
them), ``dma_copy`` (DMA queues). FLOPs are the matmuls' ``2*K*M*N``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.ops.grouped_swiglu import BLOCK_SIZE, max_blocks
from harness.ops.nki.grouped_swiglu_kernel import MOVING_MAX, PART, tile_count

BF16, F32, I32 = 2, 4, 4  # bytes per element

# The source's 30B-A3B cut, per rank: seq 2048 x top-4 routed rows, hidden 2048, moe_intermediate
# 768, 64 experts.
SOURCE_SHAPE = {"rows": 2048 * 4, "dim": 2048, "hidden": 768, "experts": 64}


@dataclass(frozen=True)
class KernelCost:
    kernel: str
    rows: int  # R, the routed rows the layer needs
    dim: int
    hidden: int
    experts: int
    block_size: int  # B (the replaced kernel: its 512-column chunk)
    blocks: int  # trips of the outer loop
    computed_rows: int  # columns the kernel computes (N*B; E*R for the replaced kernel)
    instructions: dict[str, int]  # by instruction kind
    dma_bytes: int  # bytes moved by dma_copy (HBM <-> SBUF)
    weight_dma_bytes: int  # of which expert weights
    matmul_flops: int
    sbuf_bytes_per_partition: int  # live SBUF of one loop trip
    psum_bytes_per_partition: int  # largest PSUM accumulator
    hbm_bytes: dict[str, int] = field(default_factory=dict)  # HBM buffers of one call

    @property
    def total_instructions(self) -> int:
        return sum(self.instructions.values())

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
    return 3 * experts * dim * hidden * BF16  # w1T, w3T, w2T: transposed copies made per call


def blockwise_cost(rows: int, dim: int, hidden: int, experts: int, block_size: int = BLOCK_SIZE) -> KernelCost:
    """The blockwise kernel at ``N = max_blocks(R, E, B)`` blocks. The trace is the same for
    every routing, so this is the cost of every routing, the worst included."""
    if not 1 <= block_size <= MOVING_MAX:
        raise ValueError(f"block_size {block_size} must be in 1..{MOVING_MAX} (nc_matmul moving free size)")
    kd, kf = tile_count(dim), tile_count(hidden)
    n = max_blocks(rows, experts, block_size)
    per_block = {
        "dma_copy": 1 + 3 + 1 + 1,  # expert id, w1 w3 w2 of that expert, the block's rows, its outputs
        "nc_matmul": 2 * kf * kd + kd * kf,  # gate and up over D tiles per F tile; down over F tiles per D tile
        "tensor_copy": 2 * kf + kd,  # PSUM -> SBUF bfloat16: gate, up per F tile; y per D tile
        "activation": kf,  # silu per F tile
        "tensor_tensor": kf,  # silu(a) * b per F tile
    }
    weight_bytes = 3 * dim * hidden * BF16
    block_dma = I32 + weight_bytes + 2 * dim * block_size * BF16
    slots = n * block_size
    sbuf = (2 * kd * hidden + kf * dim) * BF16 + (2 * kd + kf) * block_size * BF16 + 3 * block_size * BF16
    return KernelCost(
        kernel="blockwise", rows=rows, dim=dim, hidden=hidden, experts=experts, block_size=block_size, blocks=n,
        computed_rows=slots,
        instructions={kind: count * n for kind, count in per_block.items()},
        dma_bytes=n * block_dma, weight_dma_bytes=n * weight_bytes,
        matmul_flops=n * 2 * 3 * dim * hidden * block_size,
        sbuf_bytes_per_partition=sbuf, psum_bytes_per_partition=block_size * F32,
        hbm_bytes={
            "x_blocked": slots * dim * BF16, "xT": slots * dim * BF16, "block_expert": n * I32,
            "weights_transposed": _weights_hbm(experts, dim, hidden), "yT": slots * dim * BF16,
        },
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
    )


def block_size_table(block_sizes=(16, 32, 64, 128, 256, 512), shape=None) -> list[KernelCost]:
    shape = shape or SOURCE_SHAPE
    return [blockwise_cost(block_size=b, **shape) for b in block_sizes]


def _row(cost: KernelCost) -> str:
    gib = cost.hbm_total_bytes / 2**30
    return (f"| {cost.kernel} | {cost.block_size} | {cost.blocks} | {cost.computed_rows} | {cost.flops_ratio:.3f} | "
            f"{cost.total_instructions:,} | {cost.instructions['nc_matmul']:,} | {cost.dma_bytes / 1e9:.2f} | "
            f"{cost.weight_dma_bytes / 1e9:.2f} | {gib:.2f} |")


def report(shape=None) -> str:
    shape = shape or SOURCE_SHAPE
    lines = [
        f"Shape: R={shape['rows']} rows, D={shape['dim']}, F={shape['hidden']}, E={shape['experts']}, bfloat16; "
        f"the layer needs {needed_flops(shape['rows'], shape['dim'], shape['hidden']) / 1e9:.1f} GFLOP.",
        "",
        "| kernel | B | loop trips | computed rows | FLOPs / needed (every routing) | instructions | matmuls "
        "| DMA GB | weight DMA GB | HBM GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
        _row(capacity_padded_cost(**shape)),
    ]
    lines += [_row(cost) for cost in block_size_table(shape=shape)]
    return "\n".join(lines)


def worst_case_flops_ratio_bound(rows: int, experts: int, block_size: int) -> float:
    """``N*B/R <= 1 + E*(B-1)/R`` (from ``max_blocks``), independent of D and F."""
    return 1 + experts * (block_size - 1) / rows if rows else math.inf


if __name__ == "__main__":
    print(report())

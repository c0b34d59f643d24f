"""The MoE kernels' cost at a shape, from the NKI emulator's traces: ours and nki-library's,
forward and backward, side by side (FLOPs, instructions, DMA bytes, peak SBUF / PSUM).

Rows (``trace_rows``), each a shape-only trace (meta tensors, no numerics) of the kernel on two
programs, as an LNC=2 core launches it, on the NKI emulator (harness/kernels/emu):

forward
  ``ours``              grouped_swiglu_kernel, B = 32 (harness/kernels/ops/nki/grouped_swiglu_kernel.py)
  ``ours before``       the kernel it replaced (commit bc9d5d3: every block reloads its weights,
                        no program split, so at LNC=2 each core runs every block)
  ``nki-library``       core.moe.moe_cte.bwmm_shard_on_block, B = 128, routed rows as one-hot
                        tokens (its ``skip_weight`` reuse needs ``tensor_copy_predicated``, which
                        the emulator lacks: it reloads every block, as the kernel checks launch it)
backward
  ``ours: recompute``   grouped_swiglu_checkpoint_kernel, B = 32 (the activations the backward needs)
  ``nki-library bwd``   experimental.moe.bwd.blockwise_mm_bwd, B = 256
  ``ours: total``       the two, what harness::grouped_swiglu_backward runs on neuron

Columns: matmul FLOPs (and the ratio to what the layer needs: 3 GEMMs of R rows forward, 6
backward), instructions (all programs, and the busiest program's: what one core issues), DMA
bytes the instructions address (a weight DMA our kernel skips still counts here: a shape-only
trace cannot know the routing; ``moved`` adds our kernel's worst-routing bytes from the cost
model), peak SBUF and PSUM bytes per partition of live tiles (Python lifetime: an upper bound on
what the compiler's allocator needs). ``python3 scripts/moe_kernel_cost.py --trace`` prints the
table at the 30B-A3B cut.

The choice (measured at the cut, R = 8192, D = 2048, F = 768, E = 64, LNC=2)::

    forward  ours                 B=32   96.0 GFLOP (1.24x)  105,894 instr (52,949/core)  0.70 GB moved   SBUF 75.6 KiB  PSUM 0.2 KiB
    forward  ours before          B=32  192.1 GFLOP (2.48x)  212,424 instr (106,212/core) 6.17 GB         SBUF 122.6     PSUM 0.2
    forward  nki-library          B=128 153.4 GFLOP (1.98x)   40,607 instr (20,455/core)  1.33 GB         SBUF 160.0     PSUM 24.0
    backward ours: recompute      B=32   96.0 GFLOP           106,212 instr               0.73 GB moved
    backward nki-library bwd      B=256 459.0 GFLOP (2.97x)  139,280 instr (69,640/core)  4.93 GB         SBUF 79.0      PSUM 4.2
    backward total                      555.1 GFLOP (3.59x)  245,492 instr                5.66 GB

The neuron path calls our forward: 37% fewer FLOPs and about half the DMA bytes of
nki-library's (its same-expert reuse needs ``skip_weight``, whose ``tensor_copy_predicated`` the
emulator lacks, so as launched here it reloads every block), less than half its SBUF, and it
writes the gate/up activations the backward needs (``bwmm_shard_on_block`` writes only the
down projection's), so one forward serves the recompute. nki-library's forward wins on
instruction count (27,432 matmuls of about 171 columns against our 91,584 of 32): if a
TensorE instruction costs more than about 27 cycles beyond its columns, its forward is the
faster one. That is what the trn2 session's timing (scripts/trn2_first_session.py) settles; the
answer there would be B = 64 (half the instructions at 1.49x FLOPs: grouped_swiglu_cost's
block-size table). The backward dominates either way: nki-library's needs B = 256 at LNC=2.
"""  # noqa: E501  the table above is the script's output as printed, one row a line

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.kernels import emu as nki_emu
from harness.kernels.emu import cost as trace_cost
from harness.kernels.ops import grouped_swiglu as gs
from harness.kernels.ops.nki import grouped_swiglu_cost as cost
from harness.kernels.ops.nki import grouped_swiglu_kernel as gk
from harness.kernels.ops.nki.grouped_swiglu_backward import BACKWARD_BLOCK, NKILIB_BACKWARD, backward_size

PREVIOUS_REV = "bc9d5d3"  # the last commit with the kernel that reloaded every block
KERNEL_PATH = "harness/ops/nki/grouped_swiglu_kernel.py"  # its path at PREVIOUS_REV
# the modules it imports, renamed since PREVIOUS_REV (the harness's folders regrouped under harness/kernels)
RENAMED_SINCE = (("from harness import nki_emu", "from harness.kernels import emu as nki_emu"),
                 ("harness.ops.", "harness.kernels.ops."))
NKILIB_FORWARD_BLOCK = 128


@dataclass
class Row:
    direction: str  # "forward" / "backward"
    name: str
    block: int
    programs: int
    matmul_flops: int
    needed_flops: int
    instructions: int
    busiest_program_instructions: int
    dma_bytes: int
    dma_bytes_moved: int | None  # worst routing, where the model knows it
    peak_sbuf: int
    peak_psum: int
    seconds: float
    note: str = ""

    @property
    def flops_ratio(self) -> float:
        return self.matmul_flops / self.needed_flops


@contextlib.contextmanager
def _per_program_instructions():
    """Count each traced instruction against the program that issued it."""
    counts: Counter = Counter()
    real = trace_cost.Program.instruction  # one Program per program of the launch (harness/kernels/emu/cost.py)

    def instruction(self, *args, **kwargs):
        counts[self.id] += 1
        return real(self, *args, **kwargs)

    trace_cost.Program.instruction = instruction
    try:
        yield counts
    finally:
        trace_cost.Program.instruction = real


def _traced(direction, name, kernel, args, kwargs, grid, needed, block, moved=None, note=""):
    start = time.time()
    with _per_program_instructions() as per_program:
        _, report = nki_emu.trace(kernel, numerics=False, grid=grid)(*args, **kwargs)
    return Row(direction, name, block, report.programs, report.matmul_flops, needed, report.instruction_count,
               max(per_program.values()), report.dma_bytes, moved, report.peak_sbuf_bytes_per_partition,
               report.peak_psum_bytes_per_partition, time.time() - start, note)


def _meta(shape, dtype=torch.bfloat16):
    return nki_emu.meta(shape, dtype)


def _previous_kernel(rev: str):
    """The kernel at ``rev`` (from git), imported against the emulator."""
    root = Path(__file__).resolve().parents[4]
    source = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{KERNEL_PATH}"], check=True,
                            capture_output=True, text=True).stdout
    for before, now in RENAMED_SINCE:
        source = source.replace(before, now)
    path = Path(tempfile.mkdtemp()) / "previous_grouped_swiglu_kernel.py"
    path.write_text(source)

    with nki_emu.installed():
        spec = importlib.util.spec_from_file_location("previous_grouped_swiglu_kernel", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.grouped_swiglu_kernel


def forward_rows(rows: int, dim: int, hidden: int, experts: int, previous_rev: str | None = PREVIOUS_REV) -> list[Row]:
    needed = cost.needed_flops(rows, dim, hidden)
    ours = nki_emu.import_module("harness.kernels.ops.nki.grouped_swiglu_kernel")
    n = gs.max_blocks(rows, experts)
    args = (_meta((n, min(dim, gk.PART), gk.tile_count(dim), gs.BLOCK_SIZE)), _meta((n, 1), torch.int32),
            _meta((experts, dim, 2, hidden)), _meta((experts, hidden, dim)))
    analytic = cost.blockwise_cost(rows, dim, hidden, experts)
    result = [_traced("forward", "ours", ours.grouped_swiglu_kernel, args, {}, (gk.PROGRAMS,), needed, gs.BLOCK_SIZE,
                      analytic.dma_bytes_moved, "weights once per expert per program (E+1 loads, worst routing)")]
    if previous_rev:
        before = _previous_kernel(previous_rev)
        old_args = (_meta((dim, n * gs.BLOCK_SIZE)), _meta((n, 1), torch.int32), _meta((experts, dim, hidden)),
                    _meta((experts, dim, hidden)), _meta((experts, hidden, dim)))
        result.append(_traced("forward", f"ours before ({previous_rev})", before, old_args, {}, (gk.PROGRAMS,), needed,
                              gs.BLOCK_SIZE, note="no program split: at LNC=2 each core runs every block"))
    library = nki_emu.import_module("nkilib_src.nkilib.core.moe.moe_cte.bwmm_shard_on_block").bwmm_shard_on_block
    b = NKILIB_FORWARD_BLOCK
    n = gs.max_blocks(rows, experts, b)
    dim_p = -(-dim // 512) * 512
    result.append(_traced(
        "forward", "nki-library bwmm_shard_on_block", library,
        (_meta((rows + 1, dim_p)), _meta(((rows + 1) * experts, 1)), _meta((experts, dim_p, 2, hidden)),
         _meta((experts, hidden, dim_p)), b, _meta((n * b,), torch.int32), _meta((n, 1), torch.int32)),
        {"is_tensor_update_accumulating": False}, (gk.PROGRAMS,), needed, b,
        note="skip_weight off (its reuse needs tensor_copy_predicated): every block reloads"))
    return result


def backward_rows(rows: int, dim: int, hidden: int, experts: int) -> list[Row]:
    dim_p, hidden_p = backward_size(dim), backward_size(hidden)
    needed = 2 * cost.needed_flops(rows, dim, hidden)  # dh, dx (2), dW (3): six GEMMs of R rows
    ours = nki_emu.import_module("harness.kernels.ops.nki.grouped_swiglu_kernel")
    n = gs.max_blocks(rows, experts)
    recompute = _traced(
        "backward", "ours: recompute (checkpoint forward)", ours.grouped_swiglu_checkpoint_kernel,
        (_meta((n, min(dim_p, gk.PART), gk.tile_count(dim_p), gs.BLOCK_SIZE)), _meta((n, 1), torch.int32),
         _meta((experts, dim_p, 2, hidden_p)), _meta((experts, hidden_p, dim_p))), {}, (gk.PROGRAMS,), needed,
        gs.BLOCK_SIZE, cost.blockwise_cost(rows, dim_p, hidden_p, experts, checkpoint=True).dma_bytes_moved)
    library = nki_emu.import_module(f"nkilib_src.nkilib.{NKILIB_BACKWARD}").blockwise_mm_bwd
    b = BACKWARD_BLOCK
    n = gs.max_blocks(rows, experts, b)
    bwd = _traced(
        "backward", "nki-library blockwise_mm_bwd", library,
        (_meta((rows + 1, dim_p)), _meta(((rows + 1) * experts, 1)), _meta((experts, dim_p, 2, hidden_p)),
         _meta((experts, hidden_p, dim_p)), _meta((n, 2, hidden_p, b)), _meta((n, b, dim_p)),
         _meta((n * b,), torch.int32),
         _meta((n, 1), torch.int32), _meta((rows + 1, dim_p)), b), {"is_tensor_update_accumulating": False},
        (gk.PROGRAMS,), needed, b, note=f"B={b}: at LNC=2 a 128-row block leaves gradients unwritten")
    total = Row("backward", "ours: total (recompute + nki-library bwd)", b, gk.PROGRAMS,
                recompute.matmul_flops + bwd.matmul_flops, needed, recompute.instructions + bwd.instructions,
                recompute.busiest_program_instructions + bwd.busiest_program_instructions,
                recompute.dma_bytes + bwd.dma_bytes, (recompute.dma_bytes_moved or 0) + bwd.dma_bytes,
                max(recompute.peak_sbuf, bwd.peak_sbuf), max(recompute.peak_psum, bwd.peak_psum),
                recompute.seconds + bwd.seconds, "what harness::grouped_swiglu_backward runs on neuron")
    return [recompute, bwd, total]


def trace_rows(shape=None, previous_rev: str | None = PREVIOUS_REV) -> list[Row]:
    shape = shape or cost.SOURCE_SHAPE
    return forward_rows(**shape, previous_rev=previous_rev) + backward_rows(**shape)


def markdown(rows: list[Row], shape=None) -> str:
    shape = shape or cost.SOURCE_SHAPE
    lines = [
        f"R={shape['rows']} routed rows, D={shape['dim']}, F={shape['hidden']}, E={shape['experts']}, bfloat16, "
        f"LNC=2 (two programs); emulator shape-only traces.",
        "",
        "| direction | kernel | B | GFLOP (matmul) | x needed | instructions | busiest core | DMA GB addressed "
        "| DMA GB moved (worst routing) | peak SBUF KiB/partition | peak PSUM KiB/partition | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        moved = "" if r.dma_bytes_moved is None else f"{r.dma_bytes_moved / 1e9:.2f}"
        lines.append(
            f"| {r.direction} | {r.name} | {r.block} | {r.matmul_flops / 1e9:.1f} | {r.flops_ratio:.2f} | "
            f"{r.instructions:,} | {r.busiest_program_instructions:,} | {r.dma_bytes / 1e9:.2f} | {moved} | "
            f"{r.peak_sbuf / 1024:.1f} | {r.peak_psum / 1024:.1f} | {r.note} |")
    return "\n".join(lines)

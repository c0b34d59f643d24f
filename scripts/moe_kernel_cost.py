"""The grouped SwiGLU NKI kernel's cost at the source's shape, old and new side by side.

    python3 scripts/moe_kernel_cost.py            # analytic (harness/ops/nki/grouped_swiglu_cost.py)
    python3 scripts/moe_kernel_cost.py --trace    # + shape-only emulator traces of both kernels

``--trace`` traces the current blockwise kernel and the capacity-padded kernel it replaced (read
from git at ``--old-rev``) on the NKI emulator with no numerics (meta tensors), and prints the
emulator's cost reports next to the analytic counts (about 10 s and 130 s on one core), then
nki-library's ``bwmm_shard_on_block`` on the same routed rows (B = 128, two programs as on an
LNC=2 core; the adapter's layout, harness/kernel_checks/adapters/nkilib.py) for comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import nki_emu  # noqa: E402
from harness.ops import grouped_swiglu as gs  # noqa: E402
from harness.ops.nki import grouped_swiglu_cost as cost  # noqa: E402

OLD_REV = "d763245"  # the last commit with the capacity-padded kernel
KERNEL_PATH = "harness/ops/nki/grouped_swiglu_kernel.py"


def _old_kernel_module(rev: str):
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{KERNEL_PATH}"], check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "capacity_padded_swiglu_kernel.py"
    path.write_text(source)
    with nki_emu.installed():
        spec = importlib.util.spec_from_file_location("capacity_padded_swiglu_kernel", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def _trace(kernel, *shapes):
    args = [nki_emu.meta(s, torch.int32 if dtype == "i32" else torch.bfloat16) for s, dtype in shapes]
    start = time.time()
    _, report = nki_emu.trace(kernel, numerics=False)(*args)
    return report, time.time() - start


def _compare(name, analytic, report, seconds):
    print(f"\n{name}: emulator shape-only trace in {seconds:.1f} s")
    print(f"  emulator: {report.summary()}")
    print(f"  emulator opcodes: {dict(report.opcodes)}")
    print(f"  analytic: {analytic.total_instructions} instructions {analytic.instructions}; DMA {analytic.dma_bytes} B; "
          f"{analytic.matmul_flops} matmul FLOPs ({analytic.flops_ratio:.3f}x the layer's need)")
    same = (dict(report.opcodes) == analytic.instructions and report.dma_bytes == analytic.dma_bytes
            and report.matmul_flops == analytic.matmul_flops)
    print(f"  analytic == emulator: {same}")
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", action="store_true", help="also trace both kernels on the emulator (shape only)")
    parser.add_argument("--old-rev", default=OLD_REV, help="git revision holding the capacity-padded kernel")
    args = parser.parse_args()
    print(cost.report())
    if not args.trace:
        return 0
    shape = cost.SOURCE_SHAPE
    rows, dim, hidden, experts = shape["rows"], shape["dim"], shape["hidden"], shape["experts"]
    new = nki_emu.import_module("harness.ops.nki.grouped_swiglu_kernel")
    n = gs.max_blocks(rows, experts)
    report, seconds = _trace(new.grouped_swiglu_kernel, ((dim, n * gs.BLOCK_SIZE), "bf16"), ((n, 1), "i32"),
                             ((experts, dim, hidden), "bf16"), ((experts, dim, hidden), "bf16"),
                             ((experts, hidden, dim), "bf16"))
    ok = _compare(f"blockwise (B={gs.BLOCK_SIZE}, N={n})", cost.blockwise_cost(**shape), report, seconds)
    old = _old_kernel_module(args.old_rev)
    report, seconds = _trace(old.grouped_swiglu_kernel, ((dim, experts * rows), "bf16"), ((experts, dim, hidden), "bf16"),
                             ((experts, dim, hidden), "bf16"), ((experts, hidden, dim), "bf16"))
    ok &= _compare(f"capacity-padded (at {args.old_rev})", cost.capacity_padded_cost(**shape), report, seconds)
    library = nki_emu.import_module("nkilib_src.nkilib.core.moe.moe_cte.bwmm_shard_on_block").bwmm_shard_on_block
    n = gs.max_blocks(rows, experts, 128)
    start = time.time()
    _, report = nki_emu.trace(library[2], numerics=False)(
        nki_emu.meta((rows + 1, dim)), nki_emu.meta(((rows + 1) * experts, 1)), nki_emu.meta((experts, dim, 2, hidden)),
        nki_emu.meta((experts, hidden, dim)), 128, nki_emu.meta((n * 128,), torch.int32), nki_emu.meta((n, 1), torch.int32),
        is_tensor_update_accumulating=False)
    print(f"\nnki-library bwmm_shard_on_block (B=128, N={n}, 2 programs): emulator shape-only trace in "
          f"{time.time() - start:.1f} s\n  emulator: {report.summary()}\n  emulator opcodes: {dict(report.opcodes)}\n"
          f"  {report.matmul_flops / cost.needed_flops(rows, dim, hidden):.3f}x the layer's FLOPs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

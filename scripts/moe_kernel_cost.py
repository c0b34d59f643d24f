"""The MoE kernels' cost at the source's 30B-A3B cut (8192 routed rows, D 2048, F 768, 64 experts).

    python3 scripts/moe_kernel_cost.py            # analytic (harness/kernels/ops/nki/grouped_swiglu_cost.py)
    python3 scripts/moe_kernel_cost.py --trace    # + the emulator's traces, ours and nki-library's,
                                                  #   forward and backward (harness/kernels/ops/nki/moe_cost_table.py)

``--trace`` traces, with no numerics (meta tensors), on two programs as an LNC=2 core launches
them: our forward (and the kernel it replaced, read from git at ``--previous-rev``),
nki-library's ``bwmm_shard_on_block``, our recompute and nki-library's blockwise backward, and
prints the table (FLOPs, instructions, DMA bytes, peak SBUF/PSUM); about 1.5 minutes of one
core, most of it nki-library's kernels. It also checks that the analytic count of our forward
equals its trace (exit 1 if not). ``--markdown PATH`` writes the table there too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.kernels.ops.nki import grouped_swiglu_cost as cost  # noqa: E402
from harness.kernels.ops.nki import moe_cost_table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", action="store_true", help="also trace the kernels on the emulator (shape only)")
    parser.add_argument("--previous-rev", default="bc9d5d3",
                        help="git revision of the kernel ours replaced ('' to skip)")
    parser.add_argument("--markdown", type=Path, help="write the traced table here")
    args = parser.parse_args(argv)
    print(cost.report())
    if not args.trace:
        return 0

    rows = moe_cost_table.trace_rows(previous_rev=args.previous_rev or None)
    table = moe_cost_table.markdown(rows)
    print("\n" + table)
    print("\ntrace seconds: " + ", ".join(f"{r.name} {r.seconds:.1f}" for r in rows))
    if args.markdown:
        args.markdown.write_text(table + "\n")
    ours, analytic = rows[0], cost.blockwise_cost(**cost.SOURCE_SHAPE)
    same = (ours.instructions, ours.matmul_flops, ours.dma_bytes) == (
        analytic.total_instructions, analytic.matmul_flops, analytic.dma_bytes)
    print(f"analytic count of our forward == its trace: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

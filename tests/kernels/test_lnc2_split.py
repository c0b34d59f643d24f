"""Our NKI kernels share the work between the two programs of an LNC=2 launch (``kernel[2]``,
trn2's default), instead of each core computing everything: on the emulator,
a launch on two programs issues exactly the one-program launch's instructions, each program
its own contiguous part, and the results are the same. (The MoE kernel's form of this check is
in test_moe_blockwise_cost.py.)"""

from __future__ import annotations

import torch

from harness.kernels import emu as nki_emu
from harness.kernels.ops.nki import rope_kernel


def _traced_rope(grid, monkeypatch=None, split=None):
    module = nki_emu.import_module("harness.kernels.ops.nki.rope_kernel")
    if split is not None:
        monkeypatch.setattr(module, "program_tiles", split)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 8, 128, generator=g).bfloat16()  # 1024 vectors: two free-axis tiles of 512
    cos, sin = torch.randn(64, 128, generator=g), torch.randn(64, 128, generator=g)
    outputs, report = nki_emu.trace(module.rope_halves_kernel, grid=grid)(*rope_kernel.to_halves(x, cos, sin))
    return rope_kernel.from_halves(*outputs, x.shape), report


def test_rope_splits_its_tiles_across_the_two_programs():
    one, two = _traced_rope(()), _traced_rope((rope_kernel.PROGRAMS,))
    assert two[1].programs == 2 and two[1].opcodes == one[1].opcodes and torch.equal(one[0], two[0])
    tiles = [rope_kernel.program_tiles(1024, 2, p) for p in range(2)]
    assert tiles == [[0], [512]]


def test_the_split_check_catches_programs_that_each_run_every_tile(monkeypatch):
    """The equality above can fail: every program walking all the tiles (the kernel before)."""
    one = _traced_rope(())
    both = _traced_rope((rope_kernel.PROGRAMS,), monkeypatch, lambda n, programs, program: list(range(0, n, 512)))
    assert both[1].opcodes != one[1].opcodes

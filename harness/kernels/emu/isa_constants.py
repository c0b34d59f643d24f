"""``nki.isa.constants``: the ISA's enums (the same objects as ``nki.isa.<name>``)."""

from __future__ import annotations

from harness.kernels.emu.isa import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd  # noqa: F401

__emulator__ = True


def __getattr__(name: str):
    raise AttributeError(f"nki emulator: module nki.isa.constants has no attribute {name!r}")

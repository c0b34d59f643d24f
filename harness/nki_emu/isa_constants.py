"""``nki.isa.constants``: the ISA's enums (the same objects as ``nki.isa.<name>``)."""

from __future__ import annotations

from harness.nki_emu.isa import dge_mode, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd  # noqa: F401

__emulator__ = True


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"nki emulator: nki.isa.constants.{name} is not implemented")

"""The top-level ``nki`` module of the emulator (installed as ``sys.modules["nki"]``)."""

from __future__ import annotations

from harness.nki_emu import isa, language
from harness.nki_emu.dtypes import DType as dtype  # noqa: F401  (nki.dtype, used in kernel annotations)
from harness.nki_emu.launch import jit  # noqa: F401
from harness.nki_emu.rules import RuleViolation  # noqa: F401

__emulator__ = True
__version__ = "0.7.0+nki-emu (harness NKI emulator, not the Neuron SDK)"
EMULATOR_NAME = "nki-emu"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"nki emulator: nki.{name} is not implemented")


__all__ = ["isa", "language", "jit", "dtype", "RuleViolation"]

"""The emulator's semantic switches. Each defaults to what the NKI docs state; turning one
off is a planted defect (``harness.plants.nki_emu``) that the emulator's validation against
nki-library must catch."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Semantics:
    # nc_matmul computes dst = stationary.T @ moving (nki.isa.nc_matmul)
    matmul_transposes_stationary: bool = True
    # accumulate=True adds onto the PSUM contents (nki.isa.nc_matmul, Accumulation mode)
    psum_accumulates: bool = True
    # engines compute in float32 and round to dst.dtype on write (e.g. nki.isa.tensor_tensor, Data types)
    cast_at_destination: bool = True
    # fresh nl.ndarray memory is garbage: the emulator fills it with NaN so that a read poisons results
    poison_uninitialised: bool = True
    # integers are exact: same-dtype DMA and copies move the bits (nki.isa.dma_copy, nki.isa.tensor_copy),
    # int32/uint32 tensor_tensor runs in integer arithmetic (nki.isa.tensor_tensor), memset writes the integer
    integers_exact: bool = True
    # float32 results written to an integer tile round to nearest even and saturate (2.32's simulator)
    float_to_int_saturates: bool = True
    # abs_max / abs_min return the signed input of larger / smaller magnitude (nki.language.abs_max)
    abs_max_signed: bool = True


DOCUMENTED = Semantics()
_current = [DOCUMENTED]


def current() -> Semantics:
    return _current[-1]


@contextlib.contextmanager
def overridden(**changes):
    """Run with some semantics changed (planted defects only)."""
    _current.append(replace(current(), **changes))
    try:
        yield current()
    finally:
        _current.pop()

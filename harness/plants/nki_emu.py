"""Plants in the NKI emulator's semantics (harness/nki_emu/semantics.py): each turns one
documented rule of NKI 0.7 wrong, as a patch of ``harness.nki_emu.semantics`` applied in-process
with ``plants.planted(name)``. tests/kernels/test_nki_emu_validation.py shows each caught by
the emulator's validation against nki-library (or, for PSUM accumulation and poisoning, which
no validated nki-library path exercises, by the emulator's own tests and the kernel suite).
"""

from __future__ import annotations

from harness.plants import Plant

MODULE = "harness.nki_emu.semantics"


def _override(**changes):
    def apply(module):
        from dataclasses import replace

        module._current.append(replace(module.current(), **changes))
        return module._current.pop

    return MODULE, apply


EMULATOR_PLANTS = (
    Plant("nki_emu_matmul_no_transpose", "kernel",
          "nc_matmul computes stationary @ moving instead of stationary.T @ moving",
          ("nkilib RoPE (SBUF matmul relayout) vs rope_torch_ref",),
          patch=_override(matmul_transposes_stationary=False)),
    Plant("nki_emu_psum_overwrites", "kernel",
          "nc_matmul(accumulate=True) overwrites PSUM instead of adding to it",
          ("emulator tiled-matmul accumulation test", "kernel suite grouped_swiglu nki_kernel on nki-emu"),
          patch=_override(psum_accumulates=False)),
    Plant("nki_emu_no_cast", "kernel",
          "instructions keep float32 values instead of rounding to the destination dtype (results come back "
          "as the float32 values they hold)",
          ("nkilib rope_hf bfloat16 vs rope_hf_torch_ref (values)", "every bfloat16 output's dtype"),
          patch=_override(cast_at_destination=False)),
    Plant("nki_emu_zero_fill", "kernel",
          "fresh nl.ndarray memory reads as zeros instead of poison (NaN)",
          ("emulator uninitialised-read test",),
          patch=_override(poison_uninitialised=False)),
)

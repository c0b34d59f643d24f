"""Plants in the NKI emulator's semantics (harness/kernels/emu/semantics.py): each turns one
documented rule of NKI 0.7 wrong, as a patch of ``harness.kernels.emu.semantics`` applied in-process
with ``plants.planted(name)``. tests/kernels/test_nki_emu_validation.py shows each caught by
the emulator's validation against nki-library (or, for PSUM accumulation, poisoning and the
emulator's integer and saturation semantics -- exact integers, saturating float-to-integer writes,
signed abs_max -- by the emulator's own tests and the kernel suite).
"""

from __future__ import annotations

from dataclasses import replace

from harness.plants import Plant

MODULE = "harness.kernels.emu.semantics"


def _override(**changes):
    def apply(module):
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
    Plant("nki_emu_integers_through_float32", "kernel",
          "every read goes through float32 (integers not exact): int32 16777217 copies as 16777216, int32 "
          "tensor_tensor and memset of an integer tile round through float32",
          ("emulator exact-integer tests (tests/kernels/test_nki_emu_semantics.py)",),
          patch=_override(integers_exact=False)),
    Plant("nki_emu_float_to_int_wraps", "kernel",
          "float32 results written to an integer tile truncate and wrap instead of rounding to nearest even "
          "and saturating",
          ("emulator float-to-integer test (tests/kernels/test_nki_emu_semantics.py)",),
          patch=_override(float_to_int_saturates=False)),
    Plant("nki_emu_abs_max_magnitudes", "kernel",
          "abs_max / abs_min return the magnitude instead of the signed input of larger / smaller magnitude",
          ("emulator abs_max test (tests/kernels/test_nki_emu_semantics.py)",),
          patch=_override(abs_max_signed=False)),
)

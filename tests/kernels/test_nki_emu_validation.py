"""The NKI emulator checked against code nobody here wrote: nki-library's rope_hf, RoPE (its
SBUF-matmul relayout path included), cumsum and cross entropy (forward and backward) from the
shared wheel, run on the emulator and compared with nki-library's own torch references, on
shapes and within tolerances from nki-library's own tests (harness/kernels/emu/validation.py).
Then each deliberately wrong semantic (harness/plants/nki_emu.py) breaks what it must."""

from __future__ import annotations

import pytest
import torch

from harness import plants
from harness.registry import upstream

if upstream.missing("nki-library"):
    pytest.skip(upstream.missing("nki-library"), allow_module_level=True)

from harness.kernels.checks.registry import OPS
from harness.kernels.checks.runner import run
from harness.kernels.emu import validation


@pytest.mark.parametrize("case_id", [case.id for case in validation.CASES])
def test_nki_library_kernel_on_the_emulator_matches_its_own_reference(case_id):
    row = validation.validate(validation.by_id(case_id))
    assert row["passed"], validation.table([row])


def test_the_comparator_is_nki_librarys_max_norm_rule_and_fails_on_nan_dtype_and_size():
    ref = torch.tensor([1.0, -4.0, 2.0])
    close = validation.max_all_close
    assert close(ref + 0.04, ref, rtol=0.01, atol=0.0)["passed"]  # 0.04 <= 0.01 * max|ref|
    assert not close(ref + 0.05, ref, rtol=0.01, atol=0.0)["passed"]
    assert not close(torch.tensor([1.0, float("nan"), 2.0]), ref, rtol=1.0, atol=1.0)["passed"]
    assert not close(ref.bfloat16(), ref, rtol=1.0, atol=1.0)["passed"]


def _broken(plant: str, cases) -> set[str]:
    with plants.planted(plant):
        return {case.id for case in cases if not validation.validate(case)["passed"]}


def _cheap(ids):
    return [c for c in validation.CASES if c.id in ids]


SBUF_MATMUL_ROPE = {c.id for c in validation.CASES if "sbuf_relayout" in c.id}
NO_MATMUL = {"RoPE-64x1x8x16-interleaved-sbuf_relayout-lnc1", "cumsum-1_256_2_1_float32",
             "cross_entropy_forward-1x32128-bfloat16-pb1-cs32128"}


def test_matmul_without_the_stationary_transpose_breaks_the_rope_matmul_relayout():
    cases = _cheap(SBUF_MATMUL_ROPE | NO_MATMUL)
    assert SBUF_MATMUL_ROPE and _broken("nki_emu_matmul_no_transpose", cases) == SBUF_MATMUL_ROPE


def test_no_cast_at_the_destination_breaks_rope_hf_values_and_every_bf16_dtype():
    cheap = {"RoPE-64x1x8x16-interleaved-sbuf_relayout-lnc1", "cumsum-1_256_2_1_float32",
             "cross_entropy_forward-1x32128-bfloat16-pb1-cs32128",
             "cross_entropy_backward-1x32128-bfloat16-pb1-cs16384-mean"}
    assert _broken("nki_emu_no_cast", _cheap(cheap)) == cheap - {"cumsum-1_256_2_1_float32"}
    with plants.planted("nki_emu_no_cast"):
        row = validation.validate(validation.by_id("rope_hf-1x32x8x256x128-bfloat16-lnc1"))
    q = row["outputs"]["q_out"]
    assert q["max_err"] > 100 * q["bound"]  # the values, not only the dtype


def test_psum_that_overwrites_breaks_our_moe_kernel_on_the_emulator():
    """No validated nki-library path accumulates in PSUM (test_nki_emu.py shows the tiled
    matmul breaking); the kernel suite's grouped SwiGLU at the 30B-A3B dims (D = 2048: 16
    accumulated contraction tiles) must fail."""
    op = OPS["grouped_swiglu"]
    impl, case = op.implementation("nki_kernel"), op.case("qwen3_30b_dims")
    assert run(op, impl, "nki-emu", case, torch.bfloat16).passed
    with plants.planted("nki_emu_psum_overwrites"):
        assert not run(op, impl, "nki-emu", case, torch.bfloat16).passed


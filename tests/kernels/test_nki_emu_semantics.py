"""The NKI emulator's documented semantics listed below, each against a kernel that shows it,
and each wrong alternative kept as a plant (harness/plants/nki_emu.py) the test must catch:

- integers are exact: same-dtype DMA and copies move the values untouched (nki.isa.dma_copy,
  nki.isa.tensor_copy), an int32 tensor_tensor runs in integer arithmetic on GpSimd
  (nki.isa.tensor_tensor), memset writes the integer;
- float32 results written to an integer tile round to nearest even and saturate;
- abs_max / abs_min return the signed input of larger / smaller magnitude (nki.language.abs_max);
- NKI dtypes are NumPy dtypes; unknown names are AttributeErrors, documented but unimplemented
  ones raise NotImplementedError naming themselves when called;
- an integer index on an on-chip tile's partition dim is a size-1 slice;
- nc_matmul's transpose mode and nc_transpose move bits; max8, nc_find_index8 and
  nc_match_replace8 follow their docs' examples; a cumulative-sum scan rounds as the engine's
  one-column-at-a-time recurrence.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from harness import plants
from harness.kernels import emu as nki_emu
from harness.kernels.emu import isa as nisa
from harness.kernels.emu import language as nl
from harness.kernels.emu import nki_module
from harness.kernels.emu.isa import _scan
from harness.kernels.emu.ops import OPS
from harness.kernels.emu.rules import RuleViolation

INT32_EDGES = [16777217, 2147483647, -2147483648, -5, 0]


def _through_sbuf(copy: str):
    """x -> SBUF -> (tensor_copy) -> HBM, same dtype all the way."""
    def kernel(x):
        a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        if copy == "tensor_copy":
            b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=b, src=a)
            a = b
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    return kernel


@pytest.mark.parametrize("copy", ["dma_copy", "tensor_copy"])
def test_same_dtype_copies_are_bit_exact_for_int32(copy):
    x = torch.tensor([INT32_EDGES], dtype=torch.int32)
    assert torch.equal(nki_emu.run(_through_sbuf(copy))(x), x)


def test_uint32_copies_keep_the_high_bit():
    x = torch.tensor([[4294967295, 2147483648, 1]], dtype=torch.uint32)
    assert nki_emu.run(_through_sbuf("tensor_copy"))(x).tolist() == x.tolist()


def _int_add_kernel(a, b):
    ta = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    total = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=total, data1=ta, data2=tb, op=nl.add)  # all int32: GpSimd, integer arithmetic
    out = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=total)
    return out


def test_int32_tensor_tensor_is_integer_arithmetic():
    a = torch.tensor([[16777217, 2147483646, 2147483647, -7]], dtype=torch.int32)
    b = torch.tensor([[1, 1, 1, 3]], dtype=torch.int32)
    assert nki_emu.run(_int_add_kernel)(a, b).tolist() == [[16777218, 2147483647, -2147483648, -4]]  # wraps as int32


def _memset_kernel(value, dtype):
    def kernel():
        t = nl.ndarray((2, 3), dtype=dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=value)
        out = nl.ndarray((2, 3), dtype=dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    return kernel


def test_memset_of_an_integer_tile_writes_the_integer():
    assert set(nki_emu.run(_memset_kernel(16777217, nl.int32))().flatten().tolist()) == {16777217}
    assert set(nki_emu.run(_memset_kernel(2147483647, nl.int32))().flatten().tolist()) == {2147483647}


def test_integers_through_float32_are_caught():
    """The old behaviour (every read through float32) fails each exactness test above."""
    x = torch.tensor([INT32_EDGES], dtype=torch.int32)
    with plants.planted("nki_emu_integers_through_float32"):
        assert not torch.equal(nki_emu.run(_through_sbuf("dma_copy"))(x), x)
        a, b = torch.tensor([[16777217]], dtype=torch.int32), torch.tensor([[1]], dtype=torch.int32)
        assert nki_emu.run(_int_add_kernel)(a, b).item() != 16777218
        assert nki_emu.run(_memset_kernel(16777217, nl.int32))()[0, 0].item() != 16777217


def _to_integer_kernel(dtype):
    def kernel(x):
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        i = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=i, src=t)  # dtypes differ: through float32, converted at dst
        out = nl.ndarray(x.shape, dtype=dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=i)
        return out

    return kernel


FLOAT_TO_INT = {  # value -> (int32, uint8): round to nearest even, saturate
    2.5: (2, 2), 3.5: (4, 4), -2.5: (-2, 0), 254.5: (254, 254), 300.0: (300, 255),
    1e10: (2147483647, 255), -1e10: (-2147483648, 0), -0.4: (0, 0),
}


@pytest.mark.parametrize("dtype, column", [("int32", 0), ("uint8", 1)])
def test_float_to_integer_rounds_to_nearest_even_and_saturates(dtype, column):
    x = torch.tensor([list(FLOAT_TO_INT)], dtype=torch.float32)
    out = nki_emu.run(_to_integer_kernel(getattr(nl, dtype)))(x)
    assert out.flatten().tolist() == [v[column] for v in FLOAT_TO_INT.values()]


def test_float_to_integer_that_wraps_is_caught():
    x = torch.tensor([list(FLOAT_TO_INT)], dtype=torch.float32)
    with plants.planted("nki_emu_float_to_int_wraps"):
        out = nki_emu.run(_to_integer_kernel(nl.uint8))(x)
    assert out.flatten().tolist() != [v[1] for v in FLOAT_TO_INT.values()]


def test_abs_max_and_abs_min_return_the_signed_input():
    a, b = torch.tensor([-5.0, 3.0, 2.0]), torch.tensor([3.0, -4.0, -2.0])
    assert OPS["abs_max"].apply(a, b).tolist() == [-5.0, -4.0, -2.0]  # "x if |x| > |y|, else y"
    assert OPS["abs_min"].apply(a, b).tolist() == [3.0, 3.0, -2.0]
    with plants.planted("nki_emu_abs_max_magnitudes"):
        assert OPS["abs_max"].apply(a, b).tolist() == [5.0, 4.0, 2.0]


def test_nki_dtypes_are_numpy_dtypes():
    assert np.random.randn(3, 4).astype(nl.bfloat16).dtype == np.dtype(ml_dtypes.bfloat16) == nl.bfloat16
    assert nl.float32 == np.float32 and nl.int32 == np.int32 and nl.bool_ == np.bool_
    assert nl.float8_e4m3 == np.dtype(ml_dtypes.float8_e4m3) != nl.float8_e4m3fn
    assert len({nl.tfloat32, nl.float8_e5m2_x4, nl.float8_e4m3fn_x4}) == 3 and nl.tfloat32.itemsize == 4


def test_cpu_simulate_takes_and_returns_numpy_in_the_nki_dtypes():
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(nl.bfloat16)
    out = nki_module.cpu_simulate(_through_sbuf("tensor_copy"))[2](x)
    assert out.dtype == nl.bfloat16 and np.array_equal(out.view(np.uint16), x.view(np.uint16))


@pytest.mark.parametrize("module, name", [(nl, "made_up"), (nisa, "made_up"), (nki_module, "simulate")])
def test_unknown_names_are_attribute_errors(module, name):
    assert not hasattr(module, name) and getattr(module, name, "default") == "default"
    with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
        getattr(module, name)


def test_an_integer_on_an_on_chip_partition_dim_is_a_size_1_slice():
    def kernel(x):
        t = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        assert t[3].shape == (1, 8) and t[3, 5].shape == (1, 1) and x[1].shape == (8,)  # HBM: the dim goes
        nisa.dma_copy(dst=t[3], src=x[1:2, :])  # partition 3, the last one
        out = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    out = nki_emu.run(kernel)(x)
    assert torch.equal(out[3], x[1]) and not out[:3].any()


def test_an_integer_past_the_partitions_is_out_of_bounds():
    def kernel():
        nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)[4]

    with pytest.raises(RuleViolation, match="'bounds'"):
        nki_emu.trace(kernel, numerics=False)()


def test_trn2_sbuf_is_224_kib_per_partition():
    assert nl.tile_size.sbuf_fmax_bytes == 224 * 1024 == 229376 and nl.tile_size.sbuf_size_bytes == 28 * 2**20


# ------------------------------------------------------------------ instructions by their docs


def _transpose_kernel(x, moving_scale=1.0):
    """[p, f] -> [f, p] through nc_matmul(is_transpose=True) into a PSUM tile of x's dtype."""
    p, f = x.shape
    data = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=data, src=x)
    eye = nl.shared_identity_matrix(p, dtype=x.dtype)
    if moving_scale != 1.0:
        nisa.tensor_scalar(dst=eye, data=eye, op0=nl.multiply, operand0=moving_scale)
    t = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_matmul(dst=t, stationary=data, moving=eye, is_transpose=True)
    sb = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=t)
    out = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out


def test_matmul_transpose_mode_moves_bits_nan_and_inf_included():
    x = torch.randn(32, 48).bfloat16()
    x[0, 0], x[1, 2], x[3, 4] = float("nan"), float("inf"), -float("inf")
    out = nki_emu.run(_transpose_kernel)(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out.view(torch.int16), x.t().contiguous().view(torch.int16))


def test_matmul_transpose_mode_needs_an_identity_moving_tile():
    with pytest.raises(RuleViolation, match="'matmul-transpose'"):
        nki_emu.run(_transpose_kernel)(torch.randn(32, 48).bfloat16(), 2.0)


def _eight_kernel(instruction):
    def kernel(data, vals):
        d = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
        v = nl.ndarray(vals.shape, dtype=vals.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=d, src=data)
        nisa.dma_copy(dst=v, src=vals)
        idx = nl.ndarray((data.shape[0], 8), dtype=nl.uint32, buffer=nl.sbuf)
        if instruction == "find":
            nisa.nc_find_index8(dst=idx, data=d, vals=v)
        else:
            nisa.nc_match_replace8(dst=d, data=d, vals=v, imm=-1.0, dst_idx=idx)
        out = nl.ndarray((data.shape[0], 8), dtype=nl.uint32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=idx)
        replaced = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=replaced, src=d)
        return out, replaced

    return kernel


def test_match_replace8_pairs_repeated_vals_in_descending_slots_as_its_docs_example():
    data = torch.tensor([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], dtype=torch.float32)
    vals = torch.tensor([[3, 8, 8, 8, 8, 8, 8, 8]], dtype=torch.float32)
    idx, replaced = nki_emu.run(_eight_kernel("replace"))(data, vals)
    assert idx.tolist() == [[2, 10, 9, 8, 7, 6, 5, 4]]  # the docs' dst_idx
    assert replaced.tolist() == [[1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1]]


def test_find_index8_pairs_repeated_vals_in_ascending_slots_and_marks_the_missing():
    data = torch.tensor([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], dtype=torch.float32)
    vals = torch.tensor([[3, 8, 8, 8, 8, 8, 8, 5]], dtype=torch.float32)
    idx, _ = nki_emu.run(_eight_kernel("find"))(data, vals)
    assert idx.tolist() == [[2, 4, 5, 6, 7, 8, 9, 2**32 - 1]]  # all-ones sentinel for a missing val


def test_max8_gives_each_partitions_eight_largest_descending():
    def kernel(x):
        d = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=d, src=x)
        top = nl.ndarray((x.shape[0], 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.max8(dst=top, src=d)
        out = nl.ndarray((x.shape[0], 8), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=top)
        return out

    x = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    assert torch.equal(nki_emu.run(kernel)(x), x.sort(dim=1, descending=True).values[:, :8])


def test_the_cumulative_sum_scan_rounds_as_the_column_recurrence():
    """The fast path (one float32 accumulation per row) equals the engine's recurrence
    state = (1 * state) + x_i rounded at each column, bit for bit."""
    g = torch.Generator().manual_seed(0)
    b = (torch.randn(8, 3000, generator=g) * 1000).bfloat16().float()
    initial = torch.randn(8, generator=g)
    fast = _scan(torch.ones_like(b), b, initial, OPS["multiply"], OPS["add"], False, False)
    state, slow = initial.numpy().copy(), np.empty_like(b.numpy())
    for i in range(b.shape[1]):
        state = np.float32(1) * state + b.numpy()[:, i]  # float32 numpy: rounds each step
        slow[:, i] = state
    assert np.array_equal(fast.numpy(), slow)


def test_dma_transpose_moves_a_2d_tile_bits_unchanged():
    def kernel(x):
        t = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=x)
        out = nl.ndarray(t.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = torch.randn(16, 24).bfloat16()
    assert torch.equal(nki_emu.run(kernel)(x), x.t())

"""The NKI emulator's semantics that nki-library's training kernels (attention, MLP, QKV,
output projection, norms, MoE) use, each checked against its NKI 0.7 docs page
(harness/kernels/emu/rules.py SEMANTICS) by a cheap kernel or object of its own.

Specification:
- ``nl.NKIObject`` subclasses, ``@dataclass`` or not, take every field by keyword, where a field
  is an annotated name or a plain class attribute (the NKI language guide's classes: the default
  ``__init__`` takes each field, defaulting to its class value, then calls ``__post_init__``);
  a name that is no field is refused; methods, properties and dunders are not fields. A field
  the constructor was not given stays unset, in a ``@dataclass`` too, and reading it is an
  AttributeError naming it (nki-library's ``MLPTKGConstantsDimensionSizes`` never passes its
  declared ``remainderIFused``).
- ``nki.isa.range_select`` (Vector Engine; NeuronCore-v3, so trn2, and newer): an element of
  ``on_true_tile`` is kept where its free index + ``range_start`` passes ``comp_op0`` against
  ``bound0`` and ``comp_op1`` against ``bound1`` (both one value per partition), else
  ``on_false_value``; ``reduce_op`` over the result goes through the Vector Engine's accumulator
  registers (``reduce_cmd``) into ``reduce_res``. A float32 minimum written to bfloat16 is -inf
  (the docs' numerical-stability note).
- ``nki.isa.tensor_scalar_reduce``: ``tensor_scalar`` with one arithmetic operator (no bitvec),
  and ``reduce_op`` (add, multiply, maximum, minimum) of its result along the free axes into
  ``reduce_res``.
- ``nki.isa.tensor_partition_reduce`` (GpSimd, so no PSUM): ``dst[0, f]`` = ``op`` over the
  partitions of ``data[:, f]`` (attention_bwd's dsinks); its operators are add, mean, max and the
  bitvec three (add and max implemented), any other is refused.
- ``nki.isa.activation_reduce``: ``activation`` with ``reduce_cmd=reset_reduce`` into
  ``reduce_res``; ``reduce_op`` must be ``nl.add``.
- ``nc_matmul(perf_mode=double_row)`` (NeuronCore-v3's double FP8 matmul): float8 stationary
  ``[K, 2, M]`` and moving ``[K, 2, N]`` contract over ``K x 2``; not with column tiling or
  transpose mode, not on other dtypes; the mode may be named by its string.
- ``.ap(pattern, dtype=...)`` is a reinterpret cast: the same bytes, pattern and offset counted in
  elements of the new dtype, read and written bit for bit (rmsnorm_quant stores a float32 scale
  as four float8 bytes).
- ``nki.isa.local_gather`` (GpSimd): each core's 16 partitions share one index list, its
  16-partition slice of ``index`` read partition first; each partition gathers, at each of the
  first ``num_valid_indices`` indices, ``num_elem_per_idx`` contiguous elements of its own row
  (the docs' example: src [128, 512, 4], indices scaled by 4, 64 valid, dst [128, 4, 16, 4]).
- A view is a description until an instruction consumes it: one reaching past its tile's
  partition may be made (output_projection_tkg makes one for an index it then skips), and is
  refused (``partition-access``) when an instruction reads or writes it.
- An access pattern is a loop: a write through one that reaches an element more than once (a 0
  step, as qkv_cte's unused ``activation_reduce`` dst) leaves the last value of the loop there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from harness.kernels import emu as nki_emu
from harness.kernels.emu import isa as nisa
from harness.kernels.emu import language as nl
from harness.kernels.emu.rules import RuleViolation


@dataclass
class _Section(nl.NKIObject):
    """As nki-library's attention_cte.SectionParams: plain class attributes, no annotations."""

    index = None
    offset = 0

    def end(self):
        return self.offset + 1


@dataclass
class _Mixed(nl.NKIObject):
    rows: int
    scale: float = 1.0
    tag = "t"

    def __post_init__(self):
        self.derived = self.rows * self.scale


def test_nki_object_dataclasses_take_plain_class_attributes_by_keyword():
    section = _Section(index=3, offset=7)
    assert (section.index, section.offset, section.end()) == (3, 7, 8)
    assert (_Section().index, _Section().offset) == (None, 0)
    mixed = _Mixed(rows=2, scale=3.0, tag="u")
    assert (mixed.rows, mixed.scale, mixed.tag, mixed.derived) == (2, 3.0, "u", 6.0)
    assert _Mixed(4).tag == "t"
    with pytest.raises(TypeError, match="colour"):
        _Section(index=1, colour=2)
    with pytest.raises(TypeError):
        _Section(end=1)  # a method is no field


@dataclass
class _Dimensions(nl.NKIObject):
    """As nki-library's MLPTKGConstantsDimensionSizes: annotated fields, one never passed."""

    T: int
    remainder: int
    column_tiling_dim: int
    K: int | None = None


def test_a_dataclass_field_not_given_stays_unset_until_read():
    dims = _Dimensions(T=4, column_tiling_dim=32)
    assert (dims.T, dims.column_tiling_dim, dims.K) == (4, 32, None)
    assert not hasattr(dims, "remainder")
    with pytest.raises(AttributeError, match="remainder: this field was never given a value"):
        _ = dims.remainder
    dims.remainder = 3  # a later assignment sets it
    assert dims.remainder == 3 and _Dimensions(1, 2, 3).remainder == 2
    with pytest.raises(TypeError, match="colour"):
        _Dimensions(T=1, colour=2)


def test_plain_nki_objects_take_plain_class_attributes_by_keyword():
    class Config(nl.NKIObject):
        block = 128
        rows: int

    assert (Config(block=64, rows=2).block, Config(rows=1).block) == (64, 128)
    with pytest.raises(TypeError, match="no field 'colour'"):
        Config(colour=1)


FLOAT32_MIN = -3.4028234663852886e38


def _range_select(range_start, lower, upper, dtype, command="reset_reduce"):
    """attention_bwd's sliding-window mask: keep column j of row p where
    lower[p] <= j + range_start < upper[p], else FLOAT32_MIN; the row max into reduce_res."""
    def kernel(x, lo, hi):
        tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        bounds = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=bounds[:, 0:1], src=lo)
        nisa.dma_copy(dst=bounds[:, 1:2], src=hi)
        out = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
        row_max = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=out, on_true_tile=tile, comp_op0=nl.greater_equal, comp_op1=nl.less,
                          bound0=bounds[:, 0:1], bound1=bounds[:, 1:2], reduce_op=nl.maximum, reduce_res=row_max,
                          reduce_cmd=getattr(nisa.reduce_cmd, command), range_start=range_start,
                          on_false_value=FLOAT32_MIN)
        result = nl.ndarray(x.shape, dtype=dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=result, src=out)
        maxima = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=maxima, src=row_max)
        return result, maxima

    return kernel


def test_range_select_keeps_the_columns_inside_the_bounds_and_reduces_the_rows():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    lower, upper = torch.tensor([[10.0], [11.0], [0.0]]), torch.tensor([[12.0], [14.0], [1.0]])
    out, row_max = nki_emu.run(_range_select(10, lower, upper, nl.float32))(x, lower, upper)
    # column j is position j + 10: row 0 keeps 10, 11; row 1 keeps 11..13; row 2 keeps none
    kept = torch.tensor([[True, True, False, False], [False, True, True, True], [False] * 4])
    assert torch.equal(out, torch.where(kept, x, torch.tensor(FLOAT32_MIN)))
    assert row_max.flatten().tolist() == [1.0, 7.0, FLOAT32_MIN]


def test_range_select_into_bfloat16_writes_minus_infinity_where_it_fills():
    """The docs' numerical-stability note: FP32_MIN downcast to bfloat16 is -inf."""
    x = torch.ones(2, 4)
    lower, upper = torch.tensor([[0.0], [0.0]]), torch.tensor([[2.0], [0.0]])
    out, row_max = nki_emu.run(_range_select(0, lower, upper, nl.bfloat16))(x, lower, upper)
    assert out.dtype == torch.bfloat16 and out[0].tolist() == [1.0, 1.0, float("-inf"), float("-inf")]
    assert row_max.flatten().tolist() == [1.0, FLOAT32_MIN]


def test_range_select_refuses_bounds_that_are_not_one_column():
    def kernel(x):
        tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.range_select(dst=out, on_true_tile=tile, comp_op0=nl.greater_equal, comp_op1=nl.less,
                          bound0=tile[:, 0:2], bound1=tile[:, 0:1])
        return out

    with pytest.raises(RuleViolation, match="scalar-operand"):
        nki_emu.run(kernel)(torch.ones(2, 4))


def _scalar_reduce(op0, operand0, reduce_op):
    def kernel(x):
        tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        reduced = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=out, data=tile, op0=op0, operand0=operand0, reduce_op=reduce_op,
                                  reduce_res=reduced)
        result = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=result, src=out)
        per_row = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=per_row, src=reduced)
        return result, per_row

    return kernel


def test_tensor_scalar_reduce_reduces_the_tensor_scalar_result_along_the_free_axis():
    """attention_cte's scaled row max (multiply, then maximum) and rmsnorm_quant's absolute max
    (abs with operand 0.0, then maximum)."""
    x = torch.tensor([[1.0, -4.0, 2.0], [-0.5, 0.25, -3.0]])
    out, row_max = nki_emu.run(_scalar_reduce(nl.multiply, 0.5, nl.maximum))(x)
    assert torch.equal(out, x * 0.5) and row_max.flatten().tolist() == [1.0, 0.125]
    out, abs_max = nki_emu.run(_scalar_reduce(nl.abs, 0.0, nl.maximum))(x)
    assert torch.equal(out, x.abs()) and abs_max.flatten().tolist() == [4.0, 3.0]
    _, row_sum = nki_emu.run(_scalar_reduce(nl.add, 1.0, nl.add))(x)
    assert row_sum.flatten().tolist() == [2.0, -0.25]


def test_tensor_scalar_reduce_refuses_a_bitvec_operator():
    with pytest.raises(RuleViolation, match="alu-op"):
        nki_emu.run(_scalar_reduce(nl.bitwise_and, 1, nl.maximum))(torch.ones(2, 3))


def _activation_reduce(reduce_op):
    def kernel(x):
        tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        summed = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=out, op=nl.exp, data=tile, reduce_op=reduce_op, reduce_res=summed, scale=2.0)
        result = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=result, src=out)
        per_row = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=per_row, src=summed)
        return result, per_row

    return kernel


def test_activation_reduce_is_activation_with_reset_reduce():
    """attention_cte's exp row sums: f(data * scale + bias), and its sum per row (the Scalar
    Engine's reduce_regs, reset first); the docs allow only nl.add."""
    x = torch.tensor([[0.0, 0.5], [-1.0, 1.0]])
    out, sums = nki_emu.run(_activation_reduce(nl.add))(x)
    assert torch.allclose(out, torch.exp(2 * x)) and torch.allclose(sums.flatten(), torch.exp(2 * x).sum(1))
    with pytest.raises(RuleViolation, match="alu-op"):
        nki_emu.run(_activation_reduce(nl.maximum))(x)


def _partition_reduce(op, buffer=nl.sbuf):
    """attention_bwd's dsinks: [partitions, heads, sinks] reduced over the partitions."""
    def kernel(x):
        tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        if buffer is nl.psum:
            held = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.psum)
            nisa.tensor_copy(dst=held, src=tile)
            tile = held
        reduced = nl.ndarray((1, *x.shape[1:]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(reduced, op, tile)
        out = nl.ndarray((1, *x.shape[1:]), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=reduced)
        return out

    return kernel


def test_tensor_partition_reduce_reduces_across_the_partitions():
    x = torch.tensor([[[1.0, -4.0], [2.0, 0.5]], [[-0.5, 0.25], [-3.0, 7.0]], [[2.0, 1.0], [0.0, -1.0]]])
    assert torch.equal(nki_emu.run(_partition_reduce(nl.add))(x), x.sum(0, keepdim=True))
    assert torch.equal(nki_emu.run(_partition_reduce(nl.maximum))(x), x.amax(0, keepdim=True))


def test_tensor_partition_reduce_refuses_psum_and_an_operator_it_does_not_list():
    with pytest.raises(RuleViolation, match="gpsimd-psum"):
        nki_emu.run(_partition_reduce(nl.add, nl.psum))(torch.ones(2, 2, 2))
    with pytest.raises(RuleViolation, match="alu-op"):
        nki_emu.run(_partition_reduce(nl.minimum))(torch.ones(2, 2, 2))


def _double_row(stationary_shape, moving_shape, dtype=nl.float8_e4m3, **options):
    """dst[m, n] = sum over k, j of stationary[k, j, m] * moving[k, j, n] (perf_mode=double_row)."""
    def kernel(st, mv):
        st_sb = nl.ndarray(st.shape, dtype=st.dtype, buffer=nl.sbuf)
        mv_sb = nl.ndarray(mv.shape, dtype=mv.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=st_sb, src=st)
        nisa.dma_copy(dst=mv_sb, src=mv)
        acc = nl.ndarray((st.shape[2], mv.shape[2]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, st_sb, mv_sb, **{"perf_mode": nisa.matmul_perf_mode.double_row, **options})
        res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out

    rng = np.random.default_rng(0)
    return kernel, (rng.standard_normal(stationary_shape).astype(dtype),
                    rng.standard_normal(moving_shape).astype(dtype))


def test_double_row_matmul_contracts_over_the_partitions_and_the_pair_dimension():
    kernel, (st, mv) = _double_row((128, 2, 96), (128, 2, 512))
    out, report = nki_emu.trace(kernel)(st, mv)
    expected = np.einsum("kjm,kjn->mn", st.astype(np.float64), mv.astype(np.float64))
    assert np.allclose(out.numpy(), expected, rtol=1e-5, atol=1e-4)
    assert report.matmul_flops == 2 * 256 * 96 * 512
    # float8_e5m2, and the mode by its name as nki-library's qkv_cte passes it
    kernel, (st, mv) = _double_row((8, 2, 4), (8, 2, 16), dtype=nl.float8_e5m2)
    by_name, _ = _double_row((8, 2, 4), (8, 2, 16), dtype=nl.float8_e5m2, perf_mode="double_row")
    expected = np.einsum("kjm,kjn->mn", st.astype(np.float64), mv.astype(np.float64))
    assert np.allclose(nki_emu.run(by_name)(st, mv).numpy(), expected, rtol=1e-5, atol=1e-4)
    assert torch.equal(nki_emu.run(kernel)(st, mv), nki_emu.run(by_name)(st, mv))


@pytest.mark.parametrize("case, options", [
    ("bfloat16 operands", {}),
    ("a pair dimension of 3", {}),
    ("column tiling", {"tile_position": (0, 0), "tile_size": (128, 64)}),
    ("transpose mode", {"is_transpose": True}),
    ("an unknown mode", {"perf_mode": "quad_row"}),
])
def test_double_row_matmul_refuses_what_the_tensor_engine_cannot_pair(case, options):
    dtype = nl.bfloat16 if case == "bfloat16 operands" else nl.float8_e4m3
    pair = 3 if case == "a pair dimension of 3" else 2
    kernel, inputs = _double_row((16, pair, 8), (16, pair, 32), dtype=dtype, **options)
    with pytest.raises(RuleViolation, match="matmul-double-row"):
        nki_emu.run(kernel)(*inputs)


def test_ap_with_a_dtype_reads_the_same_bytes_as_that_dtype():
    """rmsnorm_quant's dequant scale: a [P, 1] float32 tile stored as four float8 bytes a row."""
    def kernel(x):
        tile = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        out = nl.ndarray((x.shape[0], 4), dtype=nl.float8_e4m3, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tile.ap(pattern=[[4, x.shape[0]], [1, 4]], dtype=nl.float8_e4m3))
        return out

    x = np.array([[1.5], [-2.0e-3], [3.0e5]], dtype=np.float32)
    out = nki_emu.run(kernel)(x)
    assert out.dtype == torch.float32  # float8_e4m3 values in their float32 holder
    as_fp8 = out.numpy().astype(nl.float8_e4m3)
    assert as_fp8.view(np.uint8).tobytes() == x.tobytes()


def test_ap_with_a_dtype_writes_the_bytes_the_other_dtype_reads():
    """The docs' example: an int32 [128, 256] tile seen as bfloat16 [128, 512]."""
    def kernel(values):
        src = nl.ndarray(values.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=values)
        t = nl.ndarray((128, 256), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t.ap(pattern=[[512, 128], [1, 512]], dtype=nl.bfloat16), src=src)
        out = nl.ndarray((128, 256), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    values = np.random.default_rng(0).standard_normal((128, 512)).astype(nl.bfloat16)
    out = nki_emu.run(kernel)(values)
    assert out.numpy().astype(np.int32).tobytes() == values.tobytes()


def test_ap_with_a_dtype_keeps_the_partition_rule_in_the_new_elements():
    def kernel(x):
        tile = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        out = nl.ndarray((x.shape[0], 1), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tile.ap(pattern=[[1, x.shape[0]], [1, 1]], dtype=nl.bfloat16))  # step 1, not 2
        return out

    with pytest.raises(RuleViolation, match=r"partition-access.*stride 1 is not one partition \(2 elements\)"):
        nki_emu.run(kernel)(np.ones((4, 1), dtype=np.float32))


def test_a_write_through_a_zero_step_keeps_the_last_value_of_the_loop():
    """qkv_cte's RMS sum of squares: activation_reduce's unused dst is a [P, 1] tile seen as
    [P, H] through step 0; reduce_res gets the row sums, the tile the row's last square."""
    def kernel(x):
        data = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=data, src=x)
        zero = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zero, value=0.0)
        act = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        sums = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=act.ap(pattern=[[1, x.shape[0]], [0, x.shape[1]]]), op=nl.square, data=data,
                               reduce_op=nl.add, reduce_res=sums, bias=zero)
        out = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[:, 0:1], src=act)
        nisa.dma_copy(dst=out[:, 1:2], src=sums)
        return out

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    out = nki_emu.run(kernel)(x)
    assert out[:, 0].tolist() == (x[:, -1] ** 2).tolist()
    assert out[:, 1].tolist() == (x ** 2).sum(dim=1).tolist()


def _past_the_partition(use: bool):
    def kernel(x):
        tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        past = tile.ap(pattern=[[x.shape[1], x.shape[0]], [2, x.shape[1] // 2]], offset=2)  # ends one past the row
        out = nl.ndarray((x.shape[0], x.shape[1] // 2), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=past if use else tile.ap(pattern=[[x.shape[1], x.shape[0]], [2, x.shape[1] // 2]]))
        return out

    return kernel


def test_a_view_past_its_partition_is_refused_when_used_not_when_made():
    x = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    assert nki_emu.run(_past_the_partition(use=False))(x).tolist() == [[0, 2, 4, 6], [8, 10, 12, 14]]
    with pytest.raises(RuleViolation, match="partition-access.*reaches element 8 of a 8-element partition"):
        nki_emu.run(_past_the_partition(use=True))(x)


def _local_gather(num_valid, partitions=128):
    def kernel(src, index):
        src_sb = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        index_sb = nl.ndarray(index.shape, dtype=index.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src_sb, src=src)
        nisa.dma_copy(dst=index_sb, src=index)
        out_sb = nl.ndarray((partitions, num_valid // 16, 16, 4), dtype=src.dtype, buffer=nl.sbuf)
        nisa.local_gather(dst=out_sb, src_buffer=src_sb, index=index_sb, num_elem_per_idx=4,
                          num_valid_indices=num_valid)
        out = nl.ndarray(out_sb.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=out_sb)
        return out

    return kernel


def test_local_gather_takes_each_cores_indices_partition_first_from_each_partitions_row():
    rng = np.random.default_rng(0)
    src = rng.random((128, 512, 4), dtype=np.float32)
    per_core = rng.integers(0, 512, size=(16, 4)).astype(np.uint16)
    index = np.tile(per_core, (8, 1)) * 4  # element offsets: 4 elements an index
    out = nki_emu.run(_local_gather(64))(src, index)
    order = per_core.T.reshape(-1)  # partition first: index[0, 0], index[1, 0], ..., index[15, 0], index[0, 1], ...
    expected = src[:, order, :].reshape(128, 4, 16, 4)
    assert np.array_equal(out.numpy(), expected)


@pytest.mark.parametrize("case", ["more valid indices than a core holds", "partitions not a multiple of 16"])
def test_local_gather_refuses_what_a_gpsimd_core_cannot_do(case):
    partitions, num_valid = (128, 80) if case.startswith("more") else (8, 64)
    src = np.ones((partitions, 512, 4), dtype=np.float32)
    index = np.zeros((partitions, 4), dtype=np.uint16)
    with pytest.raises(RuleViolation, match="local-gather"):
        nki_emu.run(_local_gather(num_valid, partitions))(src, index)

"""The NKI emulator (harness/nki_emu) itself: its seam and identity, the documented semantics
(matmul, PSUM accumulation, rounding at the destination, poisoned fresh memory), trn2's rules
(one violating kernel per rule, beside the same kernel at the limit), and the cost report."""

from __future__ import annotations

import sys

import pytest
import torch

from harness import nki_emu
from harness import plants
from harness.nki_emu import isa as nisa
from harness.nki_emu import language as nl
from harness.nki_emu.rules import RuleViolation


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ seam and identity


def test_seam_installs_the_emulator_as_nki_and_restores_what_was_there(monkeypatch):
    sentinel = object()
    monkeypatch.setitem(sys.modules, "nki", sentinel)
    with nki_emu.installed():
        import nki
        import nki.isa
        import nki.language

        assert nki.__emulator__ is True and "emulator" in nki.__version__
        assert nki.language is nl and nki.isa is nisa
        from harness.ops.neuron import nki_available

        ok, reason = nki_available()
        assert not ok and "emulator" in reason
    assert sys.modules["nki"] is sentinel
    assert "nki.language" not in sys.modules


def test_modules_imported_under_the_seam_leave_sys_modules_after_it():
    name = "nkilib_src.nkilib.core.cumsum.cumsum"
    pytest.importorskip("nkilib_src", reason="nki-library's wheel is not installed")
    module = nki_emu.import_module(name)
    assert module.nki.__emulator__ is True
    assert name not in sys.modules
    assert nki_emu.import_module(name) is module  # kept aside, imported once


def test_harness_kernel_modules_are_rebound_to_the_emulator_not_replaced():
    from harness.ops.nki import rope_kernel

    emulated = nki_emu.import_module("harness.ops.nki.rope_kernel")
    assert emulated is not rope_kernel and isinstance(emulated.rope_halves_kernel, nki_emu.JitKernel)
    assert sys.modules["harness.ops.nki.rope_kernel"] is rope_kernel


@pytest.mark.parametrize("module, name", [(nisa, "nki.isa.nc_matmul_mx"), (nl, "nki.language.softmax"),
                                          (nisa, "nki.isa.dma_transpose"), (nl, "nki.language.load")])
def test_a_documented_api_outside_the_subset_imports_but_raises_naming_itself_when_called(module, name):
    stub = getattr(module, name.rsplit(".", 1)[-1])  # nki-library imports some at module level
    with pytest.raises(NotImplementedError, match=rf"nki emulator: {name} is not implemented"):
        stub(None)


@pytest.mark.parametrize("module, name", [(nisa, "nki.isa.made_up"), (nl, "nki.language.made_up")])
def test_an_unknown_api_raises_naming_itself(module, name):
    with pytest.raises(NotImplementedError, match=rf"nki emulator: {name} is not implemented"):
        getattr(module, "made_up")


def test_the_real_simulator_api_is_not_faked():
    from harness.nki_emu import nki_module

    with pytest.raises(NotImplementedError, match="nki.simulate is not implemented"):
        nki_module.simulate  # noqa: B018


def test_tile_level_language_functions_raise():
    with pytest.raises(NotImplementedError, match="nki.language.add as a tile-level function"):
        nl.add(1, 2)


# ------------------------------------------------------------------ semantics


def _matmul_kernel(lhsT, rhs):
    """dst = lhsT.T @ rhs with the contraction tiled by 128 and accumulated in PSUM."""
    k, m = lhsT.shape
    n = rhs.shape[1]
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(k // 128):
        a = nl.ndarray((128, m), dtype=lhsT.dtype, buffer=nl.sbuf)
        b = nl.ndarray((128, n), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=lhsT[i * 128:(i + 1) * 128, :])
        nisa.dma_copy(dst=b, src=rhs[i * 128:(i + 1) * 128, :])
        nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=i > 0)
    res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def _matmul_inputs():
    g = _g()
    return torch.randn(512, 96, generator=g).bfloat16(), torch.randn(512, 200, generator=g).bfloat16()


def test_matmul_is_stationary_transposed_times_moving_accumulated_in_float32_psum():
    lhsT, rhs = _matmul_inputs()
    out = nki_emu.run(_matmul_kernel)(lhsT, rhs)
    exact = lhsT.double().t() @ rhs.double()
    assert out.dtype == torch.float32
    assert (out.double() - exact).abs().max() < 1e-4  # float32 accumulation of exact bf16 products


def test_psum_that_does_not_accumulate_is_caught():
    lhsT, rhs = _matmul_inputs()
    with plants.planted("nki_emu_psum_overwrites"):
        out = nki_emu.run(_matmul_kernel)(lhsT, rhs)
    assert (out.double() - lhsT.double().t() @ rhs.double()).abs().max() > 1.0


def _elementwise_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    prod = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod, data1=ta, data2=tb, op=nl.multiply)  # float32 product, rounded to bf16 here
    total = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=total, data1=prod, data2=ta, op=nl.add)
    nisa.dma_copy(dst=out, src=total)
    return out


def test_engines_compute_in_float32_and_round_at_each_destination():
    g = _g(1)
    a, b = torch.randn(128, 64, generator=g), torch.randn(128, 64, generator=g)
    out = nki_emu.run(_elementwise_kernel)(a, b)
    expected = ((a * b).bfloat16().float() + a).bfloat16()
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    assert not torch.equal(out, (a * b + a).bfloat16())  # the intermediate rounding is observable


def _forgets_half_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, : x.shape[1] // 2], src=x[:, : x.shape[1] // 2])  # the other half is never written
    nisa.dma_copy(dst=out, src=t)
    return out


def test_reading_memory_nothing_wrote_poisons_the_result():
    out = nki_emu.run(_forgets_half_kernel)(torch.ones(4, 8))
    assert torch.isnan(out[:, 4:]).all() and torch.equal(out[:, :4], torch.ones(4, 4))


def test_memory_that_reads_as_zero_would_hide_that_bug():
    with plants.planted("nki_emu_zero_fill"):
        out = nki_emu.run(_forgets_half_kernel)(torch.ones(4, 8))
    assert not torch.isnan(out).any()


def test_spmd_programs_see_their_ids_and_share_shared_hbm():
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        rows = x.shape[0] // nl.num_programs(axes=0)
        start = nl.program_id(axis=0) * rows
        t = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[start:start + rows, :])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(nl.program_id(axis=0)))
        nisa.dma_copy(dst=out[start:start + rows, :], src=t)
        return out

    x = torch.zeros(8, 4)
    out, report = nki_emu.trace(kernel, grid=(2,))(x)
    assert report.programs == 2 and torch.equal(out[:4], x[:4]) and torch.equal(out[4:], x[4:] + 1)


# ------------------------------------------------------------------ trn2 rules


def _matmul_shapes(k=128, m=128, n=512, dst_dtype=None, stationary_buffer=None, dst_shape=None, moving_k=None):
    def kernel():
        s = nl.zeros((k, m), dtype=nl.bfloat16, buffer=stationary_buffer or nl.sbuf)
        v = nl.zeros((moving_k or k, n), dtype=nl.bfloat16, buffer=nl.sbuf)
        dst = nl.ndarray(dst_shape or (m, n), dtype=dst_dtype or nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=dst, stationary=s, moving=v)

    return kernel


def _alloc(shape, buffer, dtype=None):
    return lambda: nl.ndarray(shape, dtype=dtype or nl.float32, buffer=buffer)


def _two_psum_inputs():
    a = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_tensor(dst=nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf), data1=a, data2=a, op=nl.add)


def _dma_into_psum():
    nisa.dma_copy(dst=nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.psum), src=nl.zeros((8, 8), dtype=nl.float32, buffer=nl.sbuf))


def _out_of_bounds():
    t = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf), src=t.ap(pattern=[[8, 8], [1, 16]]))


def _partition_crossing_view():
    t = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.sbuf)
    t.ap(pattern=[[1, 8], [8, 8]])  # dim 0 stepping within a partition


def _transpose_too_big():  # Vector Engine transposes at most [32, 32]
    d = nl.zeros((33, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.nc_transpose(dst=nl.ndarray((8, 33), dtype=nl.bfloat16, buffer=nl.sbuf), data=d, engine=nisa.vector_engine)


def _reduce_partition_axis():
    d = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf), op=nl.add, data=d, axis=0)


def _wide_scalar_operand():
    d = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.sbuf)
    col = nl.zeros((8, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=d, data=d, op0=nl.add, operand0=col)


def _accumulate_onto_memset_psum():
    s = nl.zeros((8, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
    dst = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=dst, stationary=s, moving=s, accumulate=True)


VIOLATIONS = {
    "partition-dim": _alloc((129, 4), nl.sbuf),
    "sbuf-capacity": _alloc((128, 49153), nl.sbuf),
    "psum-capacity": _alloc((128, 4097), nl.psum),
    "matmul-moving-fmax": _matmul_shapes(n=513),
    "matmul-stationary-fmax": _matmul_shapes(m=129, dst_shape=(128, 512)),
    "matmul-contraction": _matmul_shapes(moving_k=64),
    "matmul-memory": _matmul_shapes(stationary_buffer=nl.psum),
    "matmul-dtype": _matmul_shapes(dst_dtype=nl.bfloat16),
    "matmul-shape": _matmul_shapes(dst_shape=(128, 256)),
    "matmul-accumulate-init": _accumulate_onto_memset_psum,
    "two-psum-inputs": _two_psum_inputs,
    "dma-memory": _dma_into_psum,
    "bounds": _out_of_bounds,
    "partition-access": _partition_crossing_view,
    "transpose-size": _transpose_too_big,
    "reduce-axes": _reduce_partition_axis,
    "scalar-operand": _wide_scalar_operand,
}
AT_THE_LIMIT = {
    "partition-dim": _alloc((128, 4), nl.sbuf),
    "sbuf-capacity": _alloc((128, 49152), nl.sbuf),
    "psum-capacity": _alloc((128, 4096), nl.psum),
    "matmul-moving-fmax": _matmul_shapes(n=512),
    "matmul-stationary-fmax": _matmul_shapes(m=128),
}


@pytest.mark.parametrize("rule", sorted(VIOLATIONS))
def test_each_trn2_rule_violation_is_an_error_naming_the_rule_and_the_docs(rule):
    with pytest.raises(RuleViolation, match=rf"trn2 rule '{rule}' violated.*stated in https://awsdocs-neuron"):
        nki_emu.trace(VIOLATIONS[rule], numerics=False)()


@pytest.mark.parametrize("rule", sorted(AT_THE_LIMIT))
def test_the_same_kernel_at_the_limit_is_accepted(rule):
    _, report = nki_emu.trace(AT_THE_LIMIT[rule], numerics=False)()  # no RuleViolation
    used = (report.instruction_count, report.peak_sbuf_bytes_per_partition,
            report.peak_psum_bytes_per_partition)
    assert any(used), "the kernel at the limit traced nothing: it tests no limit"


# ------------------------------------------------------------------ cost report


def test_cost_report_counts_instructions_bytes_flops_and_footprint():
    lhsT, rhs = _matmul_inputs()
    _, report = nki_emu.trace(_matmul_kernel)(lhsT, rhs)
    assert report.instructions == {"dma": 9, "tensor": 4, "vector": 1}
    assert report.matmul_flops == 2 * 512 * 96 * 200
    assert report.dma_bytes == 2 * (512 * 96 + 512 * 200) + 4 * 96 * 200
    assert report.peak_psum_bytes_per_partition == 200 * 4
    assert report.peak_sbuf_bytes_per_partition == (96 + 200) * 2 + 200 * 4  # one a/b pair live at a time, plus res
    assert report.hbm_argument_bytes == 2 * (512 * 96 + 512 * 200) and report.hbm_allocated_bytes == 4 * 96 * 200


def test_shape_only_trace_counts_the_same_without_data():
    lhsT, rhs = _matmul_inputs()
    out, numeric = nki_emu.trace(_matmul_kernel)(lhsT, rhs)
    meta_out, shape_only = nki_emu.trace(_matmul_kernel, numerics=False)(nki_emu.meta(lhsT.shape), nki_emu.meta(rhs.shape))
    assert meta_out.device.type == "meta" and meta_out.shape == out.shape
    assert {**vars(shape_only), "numerics": True} == vars(numeric)


def test_stream_shuffle_copies_partitions_within_each_quadrant():
    def kernel(x):
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=x)
        dst = nl.zeros(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=dst, src=src, shuffle_mask=[31 - i for i in range(31)] + [255])
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst)
        return out

    x = torch.arange(64 * 2, dtype=torch.float32).reshape(64, 2)
    out = nki_emu.run(kernel)(x)
    for quadrant in (0, 32):
        assert torch.equal(out[quadrant:quadrant + 31], x[quadrant:quadrant + 32].flip(0)[:31])
        assert torch.equal(out[quadrant + 31], torch.zeros(2))  # mask 255: unmodified


def test_nki_objects_are_dataclasses_at_trace_time():
    class Config(nl.NKIObject):
        rows: int
        scale: float = 1.0

    assert vars(Config(4)) == {"rows": 4} and Config(4).scale == 1.0 and Config(rows=2, scale=3.0).scale == 3.0
    with pytest.raises(TypeError, match="missing fields"):
        Config()
    with pytest.raises(TypeError, match="no field 'colour'"):
        Config(1, colour=2)

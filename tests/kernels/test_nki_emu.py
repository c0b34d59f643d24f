"""The NKI emulator (harness/kernels/emu) itself: its seam and identity, the documented semantics
(matmul, PSUM accumulation, rounding at the destination, poisoned fresh memory), trn2's rules
(one violating kernel per rule, beside the same kernel at the limit), and the cost report.
Integer arithmetic, dtypes, indexing, transposes and scans are
tests/kernels/test_nki_emu_semantics.py, LNC=2 is tests/kernels/test_nki_emu_lnc.py."""

from __future__ import annotations

import sys

import pytest
import torch

from harness import plants
from harness.kernels import emu as nki_emu
from harness.kernels.emu import isa as nisa
from harness.kernels.emu import language as nl
from harness.kernels.emu import nki_module
from harness.kernels.emu.rules import RULES, RuleViolation
from harness.kernels.ops.neuron import nki_available
from harness.kernels.ops.nki import rope_kernel


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ seam and identity


def test_seam_installs_the_emulator_as_nki_and_restores_what_was_there(monkeypatch):
    sentinel = object()
    monkeypatch.setitem(sys.modules, "nki", sentinel)
    with nki_emu.installed():
        import nki  # noqa: PLC0415  order: the seam installs the emulator as nki
        import nki.isa  # noqa: PLC0415  order: the seam installs the emulator as nki
        import nki.language  # noqa: PLC0415  order: the seam installs the emulator as nki

        assert nki.__emulator__ is True and "emulator" in nki.__version__
        assert nki.language is nl and nki.isa is nisa
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
    emulated = nki_emu.import_module("harness.kernels.ops.nki.rope_kernel")
    assert emulated is not rope_kernel and isinstance(emulated.rope_halves_kernel, nki_emu.JitKernel)
    assert sys.modules["harness.kernels.ops.nki.rope_kernel"] is rope_kernel


@pytest.mark.parametrize("module, name", [(nisa, "nki.isa.nc_matmul_mx"), (nl, "nki.language.softmax"),
                                          (nisa, "nki.isa.bn_stats"), (nl, "nki.language.store")])
def test_a_documented_api_outside_the_subset_imports_but_raises_naming_itself_when_called(module, name):
    stub = getattr(module, name.rsplit(".", 1)[-1])  # nki-library imports some at module level
    with pytest.raises(NotImplementedError, match=rf"nki emulator: {name} is not implemented"):
        stub(None)


@pytest.mark.parametrize("module, name", [(nisa, "nki.isa"), (nl, "nki.language")])
def test_an_unknown_api_is_an_attribute_error_naming_itself(module, name):
    with pytest.raises(AttributeError, match=rf"module {name} has no attribute 'made_up'"):
        _ = module.made_up


def test_the_real_simulator_api_is_not_faked():
    with pytest.raises(AttributeError, match="nki.simulate is not faked"):
        _ = nki_module.simulate


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


def _matmul_shapes(k=128, m=128, n=512, dst_dtype=None, stationary_buffer=None, dst_shape=None, moving_k=None,
                   tiling=None):
    def kernel():
        s = nl.zeros((k, m), dtype=nl.bfloat16, buffer=stationary_buffer or nl.sbuf)
        v = nl.zeros((moving_k or k, n), dtype=nl.bfloat16, buffer=nl.sbuf)
        dst = nl.ndarray(dst_shape or (m, n), dtype=dst_dtype or nl.float32, buffer=nl.psum)
        position, size = tiling or ((), ())
        nisa.nc_matmul(dst=dst, stationary=s, moving=v, tile_position=position, tile_size=size)

    return kernel


def _used(shape, buffer, dtype=None):
    """One tile, written then read: the liveness check sees it."""
    def kernel():
        t = nl.ndarray(shape, dtype=dtype or nl.float32, buffer=buffer)
        nisa.memset(dst=t, value=0.0)
        nisa.tensor_copy(dst=t, src=t)

    return kernel


def _live_together(free_sizes, buffer):
    """Tiles of these float32 free sizes on 128 partitions, written in turn and then updated in
    turn (SBUF: each read after all were written; PSUM: each written again, as interleaved
    accumulation groups): live at once."""
    def kernel():
        tiles = [nl.ndarray((128, f), dtype=nl.float32, buffer=buffer) for f in free_sizes]
        for t in tiles:
            nisa.memset(dst=t, value=1.0)
        for t in tiles:
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

    return kernel


def _live_in_turn(free_sizes, buffer):
    """The same tiles, each written and updated before the next: never live together."""
    def kernel():
        for f in free_sizes:
            t = nl.ndarray((128, f), dtype=nl.float32, buffer=buffer)
            nisa.memset(dst=t, value=1.0)
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

    return kernel


def _two_psum_inputs():
    a = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_tensor(dst=nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf), data1=a, data2=a, op=nl.add)


def _dma_into_psum():
    nisa.dma_copy(dst=nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.psum),
                  src=nl.zeros((8, 8), dtype=nl.float32, buffer=nl.sbuf))


def _out_of_bounds():
    t = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf), src=t.ap(pattern=[[8, 8], [1, 16]]))


def _partition_crossing_view():
    t = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.sbuf)
    t.ap(pattern=[[1, 8], [8, 8]])  # dim 0 stepping within a partition


def _partition_step(step: int):
    """The docs' example (NKI access patterns): a (16, 32) SBUF tile read with a partition step
    of ``step`` partitions; 2 reads every other partition, which is illegal."""
    def kernel():
        t = nl.zeros((16, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=nl.ndarray((16 // step, 32), dtype=nl.float32, buffer=nl.sbuf),
                         src=t.ap(pattern=[[32 * step, 16 // step], [1, 32]], offset=0))

    return kernel


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


def _alu(instruction: str, op):
    def kernel():
        d = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.sbuf)
        if instruction == "tensor_scalar":
            nisa.tensor_scalar(dst=d, data=d, op0=op, operand0=2.0)
        elif instruction == "tensor_tensor":
            nisa.tensor_tensor(dst=d, data1=d, data2=d, op=op)
        elif instruction == "tensor_reduce":
            nisa.tensor_reduce(dst=nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf), op=op, data=d, axis=1)
        else:
            nisa.activation(dst=d, op=op, data=d)

    return kernel


def _dma(**options):
    def kernel():
        t = nl.zeros((8, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.shared_hbm), src=t, **options)

    return kernel


SBUF_FLOATS = 224 * 1024 // 4  # 57344 float32 per partition on trn2
# rule[/case] -> (the violating kernel, the same kernel at the limit or None)
RULE_CASES = {
    "partition-dim": (_used((129, 4), nl.sbuf), _used((128, 4), nl.sbuf)),
    "sbuf-capacity/one-tile": (_used((128, SBUF_FLOATS + 1), nl.sbuf), _used((128, SBUF_FLOATS), nl.sbuf)),
    "sbuf-capacity/live-tiles": (_live_together([19115, 19115, 19115], nl.sbuf),
                                 _live_together([19115, 19115, 19114], nl.sbuf)),  # 224 KiB exactly
    "psum-capacity/one-tile": (_used((128, 4097), nl.psum), _used((128, 4096), nl.psum)),
    "psum-capacity/live-tiles": (_live_together([2048] * 3, nl.psum), _live_together([2048] * 2, nl.psum)),
    "partition-access/docs-every-other-partition": (_partition_step(2), _partition_step(1)),
    "partition-access/within-a-partition": (_partition_crossing_view, None),
    "alu-op/tensor_scalar-exp": (_alu("tensor_scalar", nl.exp), _alu("tensor_scalar", nl.multiply)),
    "alu-op/tensor_tensor-divide": (_alu("tensor_tensor", nl.divide), _alu("tensor_tensor", nl.multiply)),
    "alu-op/tensor_reduce-power": (_alu("tensor_reduce", nl.power), _alu("tensor_reduce", nl.add)),
    "activation-op/cos": (_alu("activation", nl.cos), _alu("activation", nl.sin)),
    "trn3-only/abs_max": (_alu("tensor_tensor", nl.abs_max), _alu("tensor_tensor", nl.maximum)),
    "trn3-only/abs_min": (_alu("tensor_tensor", nl.abs_min), _alu("tensor_tensor", nl.minimum)),
    "dma-rmw": (_dma(dst_rmw_op=nl.add), _dma()),
    "matmul-moving-fmax": (_matmul_shapes(n=513), _matmul_shapes(n=512)),
    "matmul-stationary-fmax": (_matmul_shapes(m=129, dst_shape=(128, 512)), _matmul_shapes(m=128)),
    "matmul-contraction": (_matmul_shapes(moving_k=64), None),
    "matmul-memory": (_matmul_shapes(stationary_buffer=nl.psum), None),
    "matmul-dtype": (_matmul_shapes(dst_dtype=nl.bfloat16), None),
    "matmul-shape": (_matmul_shapes(dst_shape=(128, 256)), None),
    "matmul-tiling": (_matmul_shapes(k=64, m=128, tiling=((32, 0), (64, 128))),  # row 32 of a 64-row tile
                      _matmul_shapes(k=64, m=128, tiling=((64, 0), (64, 128)))),
    "matmul-accumulate-init": (_accumulate_onto_memset_psum, None),
    "two-psum-inputs": (_two_psum_inputs, None),
    "dma-memory": (_dma_into_psum, None),
    "bounds": (_out_of_bounds, None),
    "transpose-size": (_transpose_too_big, None),
    "reduce-axes": (_reduce_partition_axis, None),
    "scalar-operand": (_wide_scalar_operand, None),
}


@pytest.mark.parametrize("case", sorted(RULE_CASES))
def test_each_trn2_rule_violation_is_an_error_naming_the_rule_and_the_docs(case):
    rule = case.split("/")[0]
    with pytest.raises(RuleViolation, match=rf"trn2 rule '{rule}' violated.*stated in https://awsdocs-neuron"):
        nki_emu.trace(RULE_CASES[case][0], numerics=False)()


@pytest.mark.parametrize("case", sorted(c for c, (_, limit) in RULE_CASES.items() if limit is not None))
def test_the_same_kernel_at_the_limit_is_accepted(case):
    _, report = nki_emu.trace(RULE_CASES[case][1], numerics=False)()  # no RuleViolation
    used = (report.instruction_count, report.peak_sbuf_bytes_per_partition,
            report.peak_psum_bytes_per_partition)
    assert any(used), "the kernel at the limit traced nothing: it tests no limit"


@pytest.mark.parametrize("buffer, sizes", [(nl.sbuf, [19115] * 3), (nl.psum, [2048] * 3)])
def test_tiles_over_capacity_that_are_never_live_together_fit(buffer, sizes):
    """Capacity counts what is live at once, not what was ever allocated."""
    _, report = nki_emu.trace(_live_in_turn(sizes, buffer), numerics=False)()
    assert report.peak_sbuf_bytes_per_partition + report.peak_psum_bytes_per_partition == max(sizes) * 4


def test_every_rule_has_a_violating_kernel():
    covered = {c.split("/")[0] for c in RULE_CASES}
    elsewhere = {"lnc-race", "core-barrier", "matmul-transpose",  # test_nki_emu_lnc.py, test_nki_emu_semantics.py
                 "pinned-address",  # test_nki_emu_moe_instructions.py
                 "matmul-double-row", "local-gather"}  # test_nki_emu_core_kernels.py
    assert set(RULES) - covered - elsewhere == {"on-chip-operand", "gpsimd-psum", "same-tile-size", "iota-memory",
                                                "dma-size", "stream-shuffle", "transpose-memory", "transpose-dtype",
                                                "matmul-psum-bank"}


# ------------------------------------------------------------------ cost report


def test_cost_report_counts_instructions_bytes_flops_and_footprint():
    lhsT, rhs = _matmul_inputs()
    _, report = nki_emu.trace(_matmul_kernel)(lhsT, rhs)
    assert report.instructions == {"dma": 9, "tensor": 4, "vector": 1}
    assert report.matmul_flops == 2 * 512 * 96 * 200
    assert report.dma_bytes == 2 * (512 * 96 + 512 * 200) + 4 * 96 * 200
    # live tiles, in bytes over their partitions / 128: PSUM acc [96, 200] float32; in SBUF one
    # a/b pair (128 partitions) is live at a time, then res [96, 200] float32 alone
    assert report.peak_psum_bytes_per_partition == -(-96 * 200 * 4 // 128)
    assert report.peak_sbuf_bytes_per_partition == max((96 + 200) * 2, 96 * 200 * 4 // 128)
    assert report.hbm_argument_bytes == 2 * (512 * 96 + 512 * 200) and report.hbm_allocated_bytes == 4 * 96 * 200


def test_shape_only_trace_counts_the_same_without_data():
    lhsT, rhs = _matmul_inputs()
    out, numeric = nki_emu.trace(_matmul_kernel)(lhsT, rhs)
    meta_out, shape_only = nki_emu.trace(_matmul_kernel, numerics=False)(nki_emu.meta(lhsT.shape),
                                                                          nki_emu.meta(rhs.shape))
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
    assert not hasattr(Config(), "rows")  # a field given no value stays unset, for __post_init__ to derive
    with pytest.raises(TypeError, match="no field 'colour'"):
        Config(1, colour=2)

"""The grouped SwiGLU's blockwise contract (harness/kernels/ops/grouped_swiglu.py, the NKI kernel
harness/kernels/ops/nki/grouped_swiglu_kernel.py and its twin): the static block count bounds every
routing and is attained, each row lands in a block of its own expert, the layout is computed
from tensors alone, and block -> body -> unblock equals the unblocked reference."""

from __future__ import annotations

import inspect
import itertools
import math

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

from harness.kernels.checks.compare import elementwise
from harness.kernels.ops import grouped_swiglu as gs
from harness.kernels.ops import grouped_swiglu_torch
from harness.kernels.ops.nki import grouped_swiglu_kernel as gk
from harness.kernels.ops.nki.grouped_swiglu_kernel_torch import blocked_rows_torch_ref, grouped_swiglu_kernel_torch_ref
from harness.registry.tolerances import kernel_tolerance


def _routings(rows: int, experts: int):
    """Every way to split ``rows`` expert-sorted rows over ``experts`` experts."""
    for cuts in itertools.combinations_with_replacement(range(rows + 1), experts - 1):
        bounds = (0, *cuts, rows)
        yield [bounds[i + 1] - bounds[i] for i in range(experts)]


def _blocks_used(counts, block_size: int) -> int:
    return sum(math.ceil(c / block_size) for c in counts)


def bound_problems(bound, shapes) -> list[str]:
    """Where ``bound(R, E, B)`` is not the most blocks a routing fills: too small (a routing
    overflows it) or never attained (a smaller static count would do)."""
    problems = []
    for rows, experts, block_size in shapes:
        worst = max(_blocks_used(c, block_size) for c in _routings(rows, experts))
        if bound(rows, experts, block_size) != worst:
            problems.append(f"R={rows} E={experts} B={block_size}: bound {bound(rows, experts, block_size)}, "
                            f"worst routing fills {worst}")
    return problems


SMALL_SHAPES = [(r, e, b) for r in range(0, 9) for e in range(1, 5) for b in (1, 2, 3, 4, 8)]


def test_block_count_is_the_most_blocks_any_routing_fills():
    """Exhaustive over every routing of up to 8 rows on up to 4 experts: no routing overflows
    ``max_blocks`` and one attains it."""
    assert bound_problems(gs.max_blocks, SMALL_SHAPES) == []


@pytest.mark.parametrize("planted", [
    lambda r, e, b: gs.max_blocks(r, e, b) - 1,
    lambda r, e, b: gs.max_blocks(r, e, b) + 1,
    lambda r, e, b: math.ceil(r / b) + e,  # safe, but not attained: a loose bound
    lambda r, e, b: math.ceil(r / b),  # forgets that every expert's last block may be partial
], ids=["minus_one", "plus_one", "ceil_plus_experts", "ceil_only"])
def test_block_count_check_catches_a_wrong_bound(planted):
    assert bound_problems(planted, SMALL_SHAPES)


def test_block_count_at_the_source_shape():
    """R = 2048 x top-4 rows, 64 experts, B = 32: 64 + (8192 - 64) // 32 = 318 blocks."""
    assert gs.max_blocks(8192, 64, 32) == 318
    assert gs.max_blocks(8192, 64, 32) * 32 <= 8192 + 64 * 31


def _check_layout(counts, extra_rows, block_size):
    offsets = torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32)
    rows = sum(counts) + extra_rows
    slots, block_expert = gs.block_layout(offsets, rows, block_size)
    experts = len(counts)
    num_blocks = gs.max_blocks(rows, experts, block_size)
    assert block_expert.dtype == torch.int32 and block_expert.shape == (num_blocks,)
    owner = torch.repeat_interleave(torch.arange(experts), torch.tensor(counts))
    owned = slots[: sum(counts)]
    assert owned.unique().numel() == owned.numel() and bool((owned < num_blocks * block_size).all())
    assert torch.equal(block_expert[owned // block_size].long(), owner)  # every row in a block of its own expert
    assert bool((slots[sum(counts):] == num_blocks * block_size).all())  # unowned rows: the discard slot
    assert bool((block_expert[1:] >= block_expert[:-1]).all())  # blocks sorted by expert
    used = _blocks_used(counts, block_size)
    assert bool((block_expert[used:] == experts - 1).all())  # padding blocks: the last expert
    for e, count in enumerate(counts):  # each expert's rows fill its blocks from the first slot on
        mine = owned[owner == e]
        if count:
            assert int(mine.min()) % block_size == 0
            assert torch.equal(mine, torch.arange(int(mine[0]), int(mine[0]) + count))


@pytest.mark.parametrize("counts,extra,block_size", [
    ((3, 0, 4, 2), 0, 2), ((0, 0, 9, 0), 0, 4), ((2, 1, 0, 1), 3, 2), ((1, 1, 1, 6), 0, 3), ((5,), 0, 32),
    ((3, 0, 1, 5, 0, 0, 2, 4, 1, 0, 3, 1, 0, 2, 1, 1), 2, 2),
])
def test_layout_puts_every_row_in_a_block_of_its_expert(counts, extra, block_size):
    _check_layout(counts, extra, block_size)


def test_layout_check_catches_a_planted_block_to_expert_shift(monkeypatch):
    """The assertions above can fail: blocks mapped one expert too far."""
    real = gs.block_layout

    def shifted(offsets, rows, block_size=gs.BLOCK_SIZE):
        slots, block_expert = real(offsets, rows, block_size)
        return slots, (block_expert + 1).clamp(max=offsets.shape[0] - 1)

    monkeypatch.setattr(gs, "block_layout", shifted)
    with pytest.raises(AssertionError):
        _check_layout((3, 0, 4, 2), 0, 2)


def test_layout_is_computed_from_tensors_alone():
    """No host read of the routing: the layout traces under FakeTensorMode, where reading a
    tensor's values (``.tolist()``, ``int(t)``) raises."""
    with FakeTensorMode():
        offsets = torch.empty(4, dtype=torch.int32)
        slots, block_expert = gs.block_layout(offsets, 9, 2)
    assert slots.shape == (9,) and block_expert.shape == (gs.max_blocks(9, 4, 2),)
    with FakeTensorMode(), pytest.raises(DataDependentOutputException):  # the check can fail: a host read raises there
        torch.empty(4, dtype=torch.int32).tolist()


def test_block_shapes_are_static_and_routing_is_runtime_data():
    x, offsets, w1, w2, w3 = _swiglu_args(torch.bfloat16)
    seen = []

    def body(x_blocked, block_expert, *weights):
        seen.append((tuple(x_blocked.shape), tuple(block_expert.shape)))
        return x_blocked

    for counts in ((3, 0, 4, 2), (0, 9, 0, 0), (1, 1, 1, 6)):
        gs.grouped_swiglu_blockwise(x, torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32), w1, w2, w3, body)
    n = gs.max_blocks(9, 4, gs.BLOCK_SIZE)
    assert seen == [((n * gs.BLOCK_SIZE, x.shape[1]), (n,))] * 3


# ------------------------------------------------------------------ block -> body -> unblock


def _swiglu_args(dtype, counts=(3, 0, 4, 2), extra_rows=0, dims=(4, 16, 32), seed=1):
    experts, hidden, dim = dims
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(counts) + extra_rows, dim, generator=g, dtype=torch.float64).to(dtype)
    w1, w3 = (torch.randn(experts, hidden, dim, generator=g, dtype=torch.float64).mul(0.3).to(dtype) for _ in range(2))
    w2 = torch.randn(experts, dim, hidden, generator=g, dtype=torch.float64).mul(0.3).to(dtype)
    return x, torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32), w1, w2, w3


def _twin_in_input_dtype(x_blocked, block_expert, w1, w2, w3):
    """The twin's computation on the op's blocked rows, without the kernel layout's bfloat16 cast."""
    return blocked_rows_torch_ref(x_blocked, block_expert, w1, w2, w3)


@pytest.mark.parametrize("counts,extra", [((3, 0, 4, 2), 0), ((0, 0, 9, 0), 0), ((2, 1, 0, 1), 3)])
@pytest.mark.parametrize("block_size", [2, gs.BLOCK_SIZE])
def test_blockwise_twin_equals_the_unblocked_reference_in_float64(counts, extra, block_size):
    x, offsets, w1, w2, w3 = _swiglu_args(torch.float64, counts, extra)
    blocked = gs.grouped_swiglu_blockwise(x, offsets, w1, w2, w3, _twin_in_input_dtype, block_size)
    expected = grouped_swiglu_torch.grouped_swiglu_torch_ref(x, offsets, w1, w2, w3)
    torch.testing.assert_close(blocked, expected, rtol=1e-12, atol=1e-12)
    if extra:
        assert not blocked[-extra:].any()


@pytest.mark.parametrize("counts,extra", [((3, 0, 4, 2), 0), ((2, 1, 0, 1), 3)])
def test_kernel_layout_with_the_twin_is_the_op_bitwise_in_bfloat16(counts, extra):
    """The twin through the kernel's layout (bfloat16 casts, transposes) computes exactly what the
    CPU op computes: the same rounding points."""
    x, offsets, w1, w2, w3 = _swiglu_args(torch.bfloat16, counts, extra)
    via = gk.grouped_swiglu_via(grouped_swiglu_kernel_torch_ref, x, offsets, w1, w2, w3)
    torch.testing.assert_close(via, torch.ops.harness.grouped_swiglu(x, offsets, w1, w2, w3), rtol=0, atol=0)


def test_blockwise_check_catches_blocks_computed_with_the_wrong_expert():
    """The float64 equality above can fail: each block computed with the next expert's weights."""
    x, offsets, w1, w2, w3 = _swiglu_args(torch.float64)

    def wrong_expert(x_blocked, block_expert, *weights):
        return _twin_in_input_dtype(x_blocked, (block_expert + 1) % w1.shape[0], *weights)

    planted = gs.grouped_swiglu_blockwise(x, offsets, w1, w2, w3, wrong_expert, 2)
    assert not torch.allclose(planted, grouped_swiglu_torch.grouped_swiglu_torch_ref(x, offsets, w1, w2, w3))


def test_twin_rejects_a_load_map_entry_out_of_range_and_a_first_block_that_loads_nothing():
    x, _, w1, w2, w3 = _swiglu_args(torch.bfloat16)
    gate_up, down = gk.weight_layout(w1, w2, w3)
    x_blocks = torch.zeros(2, x.shape[1], 1, 2, dtype=torch.bfloat16)
    with pytest.raises(IndexError, match=r"weight_load\[1\] = 5 is neither an expert index 0..3 nor 4"):
        grouped_swiglu_kernel_torch_ref(x_blocks, torch.tensor([[0], [5]], dtype=torch.int32), gate_up, down)
    with pytest.raises(IndexError, match=r"weight_load\[0\] = 4 keeps weights no block loaded"):
        grouped_swiglu_kernel_torch_ref(x_blocks, torch.tensor([[4], [1]], dtype=torch.int32), gate_up, down)
    grouped_swiglu_kernel_torch_ref(x_blocks, torch.tensor([[0], [4]], dtype=torch.int32), gate_up, down)  # keeps 0


@pytest.mark.parametrize("programs", [1, 2, 3])
def test_load_map_loads_at_every_program_start_and_expert_change_only(programs):
    block_expert = torch.tensor([0, 0, 0, 2, 2, 3, 3, 3, 3], dtype=torch.int32)
    load = gk.weight_loads(block_expert, 4, programs).reshape(-1)
    starts = {r.start for r in (gk.program_blocks(9, programs, p) for p in range(programs))}
    for n in range(9):
        loads = n in starts or n == 0 or block_expert[n] != block_expert[n - 1]
        assert int(load[n]) == (int(block_expert[n]) if loads else 4), (n, load.tolist())


def test_load_map_is_computed_from_tensors_alone():
    with FakeTensorMode():
        load = gk.weight_loads(torch.empty(7, dtype=torch.int32), 4)
    assert load.shape == (7, 1) and load.dtype == torch.int32


def test_cpu_op_runs_the_blockwise_path(monkeypatch):
    x, offsets, w1, w2, w3 = _swiglu_args(torch.bfloat16)
    calls = []
    real = gs.to_blocks
    monkeypatch.setattr(gs, "to_blocks", lambda *a: calls.append(a[2]) or real(*a))
    torch.ops.harness.grouped_swiglu(x, offsets, w1, w2, w3)
    assert calls == [gs.max_blocks(x.shape[0], w1.shape[0]) * gs.BLOCK_SIZE]


def test_nki_kernels_take_tensors_only():
    """Compiled once per shape: no argument can carry the routing or the block size as a Python
    value; each kernel and its twin share the signature (also checked by the registry)."""
    for kernel in (gk.grouped_swiglu_kernel_source, gk.grouped_swiglu_checkpoint_kernel_source):
        parameters = inspect.signature(kernel).parameters
        assert list(parameters) == ["x_blocks", "weight_load", "gate_up", "down"]
        assert all(p.default is inspect.Parameter.empty for p in parameters.values())


def test_kernel_on_the_emulator_meets_the_kernel_tolerance_with_d_and_f_tiled():
    """The NKI kernel body itself (harness NKI emulator) on blocks of several experts with D and
    F tiled over 128 partitions (the registry's cases tile only the one-expert 30B case): within
    the grouped-matmul bfloat16 tolerance of the float64 truth (harness/registry/tolerances.py), as its
    twin is; the two differ only where a float32 PSUM sum rounds differently."""
    g = torch.Generator().manual_seed(3)
    experts, hidden, dim = 3, 256, 256
    counts = (5, 0, 27)
    x = torch.randn(sum(counts), dim, generator=g).bfloat16()
    w1, w3 = (torch.randn(experts, hidden, dim, generator=g).mul(0.05).bfloat16() for _ in range(2))
    w2 = torch.randn(experts, dim, hidden, generator=g).mul(0.05).bfloat16()
    offsets = torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32)
    truth = grouped_swiglu_torch.grouped_swiglu_torch_ref(x.double(), offsets, w1.double(), w2.double(), w3.double())
    tolerance = kernel_tolerance("grouped_matmul", torch.bfloat16)
    emulated = gk.grouped_swiglu_emulated(x, offsets, w1, w2, w3)
    twin = gk.grouped_swiglu_via(grouped_swiglu_kernel_torch_ref, x, offsets, w1, w2, w3)
    for result in (emulated, twin):
        stats = elementwise(result, truth, tolerance)
        assert stats["passed"], stats
    assert (emulated != twin).float().mean() < 0.05
    # the check can fail: the blocks computed with the experts in reverse order
    wrong = gk.grouped_swiglu_via(grouped_swiglu_kernel_torch_ref, x, offsets, w1.flip(0), w2.flip(0), w3.flip(0))
    assert not elementwise(wrong, truth, tolerance)["passed"]


def test_a_program_whose_first_block_loads_nothing_computes_poison_on_the_emulator():
    """The load map is data the kernel trusts: a program whose run starts with "keep" reads weight
    tiles nothing wrote, which the emulator poisons (NaN) -- the twin raises on the same map (test
    above) -- while the wrapper's map, on the same blocks, computes finite rows."""
    kernel = gk.emulated("grouped_swiglu_kernel")
    x, offsets, w1, w2, w3 = _swiglu_args(torch.bfloat16, counts=(40, 0, 30, 20))
    slots, block_expert = gs.block_layout(offsets, x.shape[0])
    args = gk.kernel_layout(gs.to_blocks(x, slots, block_expert.shape[0] * gs.BLOCK_SIZE), block_expert, w1, w2, w3)
    second = gk.program_blocks(block_expert.shape[0], gk.PROGRAMS, 1).start
    broken = args[1].clone()
    broken[second] = w1.shape[0]
    assert bool(torch.isfinite(kernel(*args).float()).all())
    poisoned = kernel(args[0], broken, *args[2:]).float()
    assert bool(poisoned[second:].isnan().any()) and bool(torch.isfinite(poisoned[:second]).all())

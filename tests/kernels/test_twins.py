"""Every harness kernel ``X.py`` has its torch twin ``X_torch.py`` with the same signature
(checked by the registry), the twins are float64-capable and agree with their kernels, the one
RoPE reference agrees with the caches it replaces, and the NKI grouped SwiGLU's capacity-padded
contract equals the unpadded reference."""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest
import torch

from harness.kernel_checks import registry
from harness.kernel_checks.registry import OPS, op_twin_problems, twin_problems
from harness.ops import grouped_swiglu as gs
from harness.ops import grouped_swiglu_torch, rope_torch
from harness.ops.nki import grouped_swiglu_kernel as gk
from harness.ops.nki import grouped_swiglu_kernel_torch, rope_kernel, rope_kernel_torch


@pytest.mark.parametrize("op_name", list(OPS))
def test_every_kernel_of_every_op_has_its_twin_with_the_same_signature(op_name):
    assert op_twin_problems(OPS[op_name]) == []


def test_ops_with_harness_implementations_list_their_kernels():
    assert {op.name for op in OPS.values() if op.kernels} == {"rotary_embedding", "grouped_swiglu"}


@pytest.fixture
def planted_package(tmp_path, monkeypatch):
    package = tmp_path / "planted_kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "good.py").write_text("def k(x, cos, sin):\n    return x\n")
    (package / "good_torch.py").write_text("def k_torch_ref(x, cos, sin):\n    return x\n")
    (package / "renamed.py").write_text("def k(x, cos, sin):\n    return x\n")
    (package / "renamed_torch.py").write_text("def k_torch_ref(x, cosine, sin):\n    return x\n")
    (package / "extra.py").write_text("def k(x, cos, sin, counts=(1,)):\n    return x\n")
    (package / "extra_torch.py").write_text("def k_torch_ref(x, cos, sin):\n    return x\n")
    (package / "lonely.py").write_text("def k(x):\n    return x\n")
    (package / "misnamed.py").write_text("def k(x):\n    return x\n")
    (package / "misnamed_torch.py").write_text("def k_reference(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "planted_kernels"
    for name in [m for m in sys.modules if m.startswith("planted_kernels")]:
        sys.modules.pop(name)


def test_twin_check_catches_planted_mismatches(planted_package):
    assert twin_problems(f"{planted_package}.good", "k") == []
    assert "differ in signature" in twin_problems(f"{planted_package}.renamed", "k")[0]
    assert "differ in signature" in twin_problems(f"{planted_package}.extra", "k")[0]
    assert "has no torch twin" in twin_problems(f"{planted_package}.lonely", "k")[0]
    assert "defines no 'k_torch_ref'" in twin_problems(f"{planted_package}.misnamed", "k")[0]
    assert "defines no kernel" in twin_problems(f"{planted_package}.good", "missing")[0]


def test_op_with_own_implementations_but_no_kernels_is_a_problem():
    import dataclasses

    op = dataclasses.replace(OPS["grouped_swiglu"], kernels=())
    assert "lists no kernels" in op_twin_problems(op)[0]


def test_nki_kernel_bodies_take_tensors_only():
    """Compiled once per shape: no argument can carry the routing as a Python value."""
    assert list(inspect.signature(gk.grouped_swiglu_kernel_source).parameters) == ["xT", "w1T", "w3T", "w2T"]
    assert all(p.default is inspect.Parameter.empty
               for p in inspect.signature(gk.grouped_swiglu_kernel_source).parameters.values())


# ------------------------------------------------------------------ the twins in float64


def _rope_args(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 3, 8, generator=g, dtype=torch.float64).to(dtype)
    cos, sin = rope_torch.rope_cos_sin(torch.randint(0, 50, (2, 5), generator=g), 8, 1e4)
    return x, cos, sin


def test_rope_twin_equals_the_op_in_float64():
    x, cos, sin = _rope_args(torch.float64)
    torch.testing.assert_close(torch.ops.harness.rope(x, cos, sin), rope_torch.rope_torch_ref(x, cos, sin), rtol=0, atol=0)
    assert rope_torch.rope_torch_ref(x, cos, sin).dtype == torch.float64


def test_rope_halves_twin_equals_the_op_through_the_kernel_layout_in_float64():
    x, cos, sin = _rope_args(torch.float64)
    halves = list(rope_kernel.to_halves(x, cos, sin))
    halves[2:] = [t.double() for t in halves[2:]]  # to_halves gives the kernel float32 cos/sin
    o1, o2 = rope_kernel_torch.rope_halves_kernel_torch_ref(*halves)
    assert o1.dtype == torch.float64
    y = rope_kernel.from_halves(o1, o2, x.shape)
    expected = rope_torch.rope_torch_ref(x, *(t.float().double() for t in (cos, sin)))
    assert torch.equal(y, expected)


def test_rope_cos_sin_in_float32_is_torchtitans_cache_bitwise():
    from torchtitan.models.common.rope import CosSinRoPE

    module = CosSinRoPE.Config(dim=16, max_seq_len=64, theta=1e6).build()
    cos, sin = rope_torch.rope_cos_sin(torch.arange(64), 16, 1e6, dtype=torch.float32)
    assert torch.equal(torch.cat((cos, sin), dim=-1), module.cache[:64])


def test_rope_reference_can_replace_the_parity_reference_bitwise():
    """The import the parity code should switch to computes the same float32 values."""
    parity = importlib.import_module("harness.parity.reference")
    positions = torch.tensor([[0, 1, 2, 900], [7, 8, 40000, 3]])
    ours = rope_torch.rope_cos_sin(positions, 16, 1e6, dtype=torch.float32)
    theirs = parity.rope_cos_sin(positions, 16, 1e6)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    x = torch.randn(2, 4, 3, 16)
    assert torch.equal(rope_torch.apply_rope(x, *ours), parity.apply_rope(x, *theirs))


def test_rope_reference_catches_a_planted_wrong_theta():
    """The bitwise comparisons above can fail."""
    cos, _ = rope_torch.rope_cos_sin(torch.arange(64), 16, 1e5, dtype=torch.float32)
    from torchtitan.models.common.rope import CosSinRoPE

    assert not torch.equal(cos, CosSinRoPE.Config(dim=16, max_seq_len=64, theta=1e6).build().cache[:64, :16])


# ------------------------------------------------------------------ grouped SwiGLU: the padded contract


def _swiglu_args(dtype, counts=(3, 0, 4, 2), extra_rows=0, dims=(4, 16, 32), seed=1):
    experts, hidden, dim = dims
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(counts) + extra_rows, dim, generator=g, dtype=torch.float64).to(dtype)
    w1, w3 = (torch.randn(experts, hidden, dim, generator=g, dtype=torch.float64).mul(0.3).to(dtype) for _ in range(2))
    w2 = torch.randn(experts, dim, hidden, generator=g, dtype=torch.float64).mul(0.3).to(dtype)
    return x, torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32), w1, w2, w3


@pytest.mark.parametrize("counts,extra", [((3, 0, 4, 2), 0), ((0, 0, 9, 0), 0), ((2, 1, 0, 1), 3)])
def test_padded_contract_equals_the_unpadded_reference_in_float64(counts, extra):
    x, offsets, w1, w2, w3 = _swiglu_args(torch.float64, counts, extra)
    padded = gk.grouped_swiglu_via(grouped_swiglu_kernel_torch.grouped_swiglu_kernel_torch_ref, x, offsets, w1, w2, w3)
    kernel_layout_in_f64 = gs.grouped_swiglu_padded(
        x, offsets, w1, w2, w3,
        lambda xp, a, b, c: grouped_swiglu_kernel_torch.grouped_swiglu_kernel_torch_ref(
            xp.t(), a.transpose(-2, -1), c.transpose(-2, -1), b.transpose(-2, -1)).t(),
    )
    expected = grouped_swiglu_torch.grouped_swiglu_torch_ref(x, offsets, w1, w2, w3)
    torch.testing.assert_close(kernel_layout_in_f64, expected, rtol=1e-12, atol=1e-12)
    assert padded.dtype == torch.float64  # the layout casts to bfloat16 (the kernel's contract)
    torch.testing.assert_close(padded, expected, rtol=2**-6, atol=2**-6 * float(expected.abs().max()))
    if extra:
        assert not padded[-extra:].any() and not kernel_layout_in_f64[-extra:].any()


def test_padded_contract_catches_a_planted_slot_error():
    """The equality above can fail: slots shifted by one row within each expert."""
    x, offsets, w1, w2, w3 = _swiglu_args(torch.float64)
    real = gs.padded_slots

    def shifted(offsets_, rows, capacity):
        slots = real(offsets_, rows, capacity)
        return torch.where(slots < slots.max(), slots + 1, slots)

    try:
        gs.padded_slots = shifted
        planted = gs.grouped_swiglu_padded(x, offsets, w1, w2, w3, gs._torch_body)
    finally:
        gs.padded_slots = real
    assert not torch.allclose(planted, grouped_swiglu_torch.grouped_swiglu_torch_ref(x, offsets, w1, w2, w3))


def test_padded_layout_is_static_in_shape_and_routing_is_runtime_data():
    x, offsets, w1, w2, w3 = _swiglu_args(torch.bfloat16)
    other = torch.tensor([0, 9, 9, 9], dtype=torch.int32)  # a different routing, same shapes
    shapes = []
    for offs in (offsets, other):
        seen = []
        gs.grouped_swiglu_padded(x, offs, w1, w2, w3, lambda xp, a, b, c: seen.append(tuple(xp.shape)) or xp)
        shapes.append(seen[0])
    assert shapes[0] == shapes[1] == (4 * x.shape[0], x.shape[1])
    slots = gs.padded_slots(offsets, x.shape[0], x.shape[0])
    assert slots.tolist() == [0, 1, 2, 18, 19, 20, 21, 27, 28]  # E=4, C=9: expert 2 from 18, expert 3 from 27


def test_cpu_op_runs_the_padded_path():
    x, offsets, w1, w2, w3 = _swiglu_args(torch.bfloat16)
    calls = []
    real = gs.pad_by_expert
    try:
        gs.pad_by_expert = lambda *a: calls.append(1) or real(*a)
        torch.ops.harness.grouped_swiglu(x, offsets, w1, w2, w3)
    finally:
        gs.pad_by_expert = real
    assert calls == [1]

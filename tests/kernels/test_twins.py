"""Every harness kernel ``X.py`` has its torch twin ``X_torch.py`` with the same signature
(checked by the registry), the twins are float64-capable and agree with their kernels, the one
RoPE reference agrees with the caches it replaces. (The grouped SwiGLU's blockwise contract:
tests/kernels/test_moe_blockwise.py.)"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from torchtitan.models.common.rope import CosSinRoPE

from harness import plants
from harness.kernels import emu as nki_emu
from harness.kernels.checks.registry import OPS, op_twin_problems, twin_problems
from harness.kernels.ops import rope_torch
from harness.kernels.ops.nki import rope_kernel, rope_kernel_torch
from harness.references import model as reference
from harness.registry import paths
from harness.registry.hf_config import Qwen3Arch


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
    op = dataclasses.replace(OPS["grouped_swiglu"], kernels=())
    assert "lists no kernels" in op_twin_problems(op)[0]


# ------------------------------------------------------------------ the twins in float64


def _rope_args(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 3, 8, generator=g, dtype=torch.float64).to(dtype)
    cos, sin = rope_torch.rope_cos_sin(torch.randint(0, 50, (2, 5), generator=g), 8, 1e4)
    return x, cos, sin


def test_rope_twin_equals_the_op_in_float64():
    x, cos, sin = _rope_args(torch.float64)
    torch.testing.assert_close(torch.ops.harness.rope(x, cos, sin), rope_torch.rope_torch_ref(x, cos, sin),
                               rtol=0, atol=0)
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
    module = CosSinRoPE.Config(dim=16, max_seq_len=64, theta=1e6).build()
    cos, sin = rope_torch.rope_cos_sin(torch.arange(64), 16, 1e6, dtype=torch.float32)
    assert torch.equal(torch.cat((cos, sin), dim=-1), module.cache[:64])


def _model_reference_rope_step(arch, positions):
    """(q, k) into and out of the model reference's RoPE step (layer 0 of the tiny dense
    fixture, float32: the parity comparison's precision)."""
    weights = reference.load_hf_tensors(paths.TINY_DENSE)
    unit = reference.unit_weight_names(arch, "layers.0", set(weights))
    x = torch.randn(*positions.shape, arch.hidden_size, generator=torch.Generator().manual_seed(5))
    steps = dict(reference.Reference(arch, torch.zeros_like(positions), positions, dtype=torch.float32)
                 .unit("layers.0", {k: weights[k].float() for k in unit}, x))
    return (steps["layers.0.attention.q_norm"], steps["layers.0.attention.k_norm"]), steps["layers.0.attention.rope"]


def test_the_model_reference_rotates_with_the_one_rope_reference_bitwise():
    """The model reference's RoPE step is this RoPE in float32 (torchtitan's cache, bitwise):
    the rotation of its own q and k by ``rope_cos_sin(dtype=float32)``, and one at a planted
    theta is not."""
    arch = Qwen3Arch.from_dir(paths.TINY_DENSE)
    positions = torch.tensor([[0, 1, 2, 900], [7, 8, 40000, 3]])
    (q, k), rotated = _model_reference_rope_step(arch, positions)
    cos, sin = rope_torch.rope_cos_sin(positions, arch.head_dim, arch.rope_theta, dtype=torch.float32)
    assert rotated[0].dtype == torch.float32
    assert all(torch.equal(a, b)
               for a, b in zip(rotated, (rope_torch.apply_rope(t, cos, sin) for t in (q, k)), strict=True))
    _, planted = _model_reference_rope_step(dataclasses.replace(arch, rope_theta=arch.rope_theta * 10), positions)
    assert not torch.equal(planted[1], rotated[1])


def test_rope_reference_catches_a_planted_wrong_theta():
    """The bitwise comparisons above can fail."""
    cos, _ = rope_torch.rope_cos_sin(torch.arange(64), 16, 1e5, dtype=torch.float32)
    assert not torch.equal(cos, CosSinRoPE.Config(dim=16, max_seq_len=64, theta=1e6).build().cache[:64, :16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kernel_on_the_emulator_equals_its_twin_bitwise(dtype):
    """The twin documents the kernel's rounding points: float32 math, one cast to x's dtype."""
    g = torch.Generator().manual_seed(11)
    half, n = 64, 700  # n > FREE_TILE: two free-axis tiles, the second partial
    x1, x2 = (torch.randn(half, n, generator=g).to(dtype) for _ in range(2))
    c1, c2, s1, s2 = (torch.randn(half, n, generator=g) for _ in range(4))
    kernel = nki_emu.import_module("harness.kernels.ops.nki.rope_kernel").rope_halves_kernel
    want = rope_kernel_torch.rope_halves_kernel_torch_ref(x1, x2, c1, c2, s1, s2)

    def matches(got):
        return all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want, strict=True))

    assert matches(nki_emu.run(kernel)(x1, x2, c1, c2, s1, s2))
    if dtype == torch.bfloat16:  # the check fails when the kernel's values skip the cast
        with plants.planted("nki_emu_no_cast"):
            assert not matches(nki_emu.run(kernel)(x1, x2, c1, c2, s1, s2))

"""The MoE backward in NKI: nki-library's blockwise backward (``experimental/moe/bwd``), fed by our
forward kernel's recompute, is ``harness::grouped_swiglu``'s backward on neuron
(harness/kernels/ops/nki/grouped_swiglu_backward.py). Checked here on the NKI emulator, two programs as
on an LNC=2 core.

Specification:
- the gradients ``dx, dw1, dw2, dw3`` meet the grouped-matmul kernel tolerance
  (harness/registry/tolerances.py) against the float64 derivative: rule 1, else arbitration (K = 8);
- against torchtitan's exact derivative (``GroupedExperts`` under autograd, computed here): the
  NKI gradients' error from float64 is at most K times torchtitan's own (max and rms) -- as
  accurate as torchtitan up to the policy's factor; measured at most 1.22x (max) and 1.27x (rms)
  on the cases here; at the 30B-A3B cut dx 0.93x / 1.03x and dw1 1.72x / 1.14x (the registry's cases,
  test_conformance, reach 3.0x against the ideal floor, inside the recorded 3.0);
- ``torch.ops.harness.grouped_swiglu``'s autograd calls ``harness::grouped_swiglu_backward``, the
  op the neuron registration gives its NKI kernel: with that op's kernel replaced by the emulated
  NKI backward, autograd through the forward op returns the NKI gradients;
- nothing in the path uses ``dma_copy(dst_rmw_op=...)`` (removed in NKI 0.3);
- each check fails on a broken backward: blocks of 128 rows at LNC=2 (nki-library's validate
  admits it, but its two programs then leave the down-projection gradient unwritten, NaN on the
  emulator), and the gate and up weight gradients swapped.
The full 30B-A3B cut (8192 routed rows, 64 experts) is in the slow tier.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.registry import upstream

if upstream.missing("nki-library"):
    pytest.skip(upstream.missing("nki-library"), allow_module_level=True)

import harness.kernels.ops  # noqa: F401  (registers the ops)
from harness.kernels import emu as nki_emu
from harness.kernels.checks.adapters import torchtitan
from harness.kernels.checks.compare import arbitrate, elementwise
from harness.kernels.emu import RuleViolation, install
from harness.kernels.ops import grouped_swiglu_torch
from harness.kernels.ops.nki import grouped_swiglu_backward as gb
from harness.registry import known_issues
from harness.registry.tolerances import kernel_tolerance

TOLERANCE = kernel_tolerance("grouped_matmul", torch.bfloat16)
GRADS = ("dx", "dw1", "dw2", "dw3")


def _inputs(counts, dim, hidden, extra_rows=0, seed=1, weight_std=0.3):
    g = torch.Generator().manual_seed(seed)
    rows, experts = sum(counts) + extra_rows, len(counts)
    x = torch.randn(rows, dim, generator=g, dtype=torch.float64).bfloat16()
    w1, w3 = (torch.randn(experts, hidden, dim, generator=g, dtype=torch.float64).mul(weight_std).bfloat16()
              for _ in range(2))
    w2 = torch.randn(experts, dim, hidden, generator=g, dtype=torch.float64).mul(weight_std).bfloat16()
    grad = torch.randn(rows, dim, generator=g, dtype=torch.float64).bfloat16()
    return grad, x, torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32), w1, w2, w3


def float64_derivative(grad, x, offsets, w1, w2, w3):
    leaves = [t.double().requires_grad_() for t in (x, w1, w2, w3)]
    y = grouped_swiglu_torch.grouped_swiglu_torch_ref(leaves[0], offsets, *leaves[1:])
    return torch.autograd.grad(y, leaves, grad.double())


def torchtitan_derivative(grad, x, offsets, w1, w2, w3):
    """``GroupedExperts``' own autograd (torchtitan's forward, this generation's API). Rows owned by
    no expert are left out of its ``dx``: ``_grouped_mm`` leaves them uninitialised (observed
    3e38; harness/kernels/ops/grouped_swiglu.py documents the op's zeros there) -- their ``dx`` is set to
    the float64 derivative's (zero), so only owned rows are compared."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, w1, w2, w3)]
    counts = torch.diff(offsets.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64))
    y = torchtitan.grouped_swiglu({"x": leaves[0], "w1": leaves[1], "w2": leaves[2], "w3": leaves[3],
                                   "num_tokens_per_expert": counts}, {}, "cpu")["y"]
    dx, *dw = torch.autograd.grad(y, leaves, grad)
    owned = int(offsets[-1]) if offsets.numel() else 0
    return (torch.cat((dx[:owned], dx.new_zeros(dx.shape[0] - owned, dx.shape[1]))), *dw)


def gradient_problems(grads, truth, titan) -> list[str]:
    """Where ``grads`` miss the kernel tolerance against float64, or are less accurate than
    torchtitan's gradients by more than the arbitration factor."""
    problems = []
    for name, got, exact, reference in zip(GRADS, grads, truth, titan, strict=True):
        if not elementwise(got, exact, TOLERANCE)["passed"]:
            versus_floor = arbitrate(got, exact, exact.to(got.dtype).double(), TOLERANCE.arbitration_factor,
                                     TOLERANCE.underflow)
            if not versus_floor["passed"]:
                problems.append(f"{name}: outside the kernel tolerance of the float64 derivative ({versus_floor})")
        versus_titan = arbitrate(got, exact, reference.double(), TOLERANCE.arbitration_factor, TOLERANCE.underflow)
        if not versus_titan["passed"]:
            problems.append(f"{name}: error {versus_titan['max_ratio']:.3g}x (max) / {versus_titan['rms_ratio']:.3g}x "
                            f"(rms) torchtitan's, over K={TOLERANCE.arbitration_factor:g}")
    return problems


CASES = {
    "four_experts_padded_F": ((3, 0, 4, 2), 64, 32, 0),
    "tiled_with_an_unowned_row": ((5, 0, 27), 256, 256, 2),
    "two_blocks_for_one_expert": ((300, 0, 20), 64, 64, 0),  # expert 0's dW summed over two 256-row blocks
}
SLOW_CASES = {
    "qwen3_30b_dims": ((5,), 2048, 768, 0),
    "qwen3_30b_dims_multi_block": ((700, 300, 0, 1048), 2048, 768, 0),  # 2048 rows, up to 5 blocks per expert
}


def _check_case(counts, dim, hidden, extra):
    args = _inputs(counts, dim, hidden, extra, weight_std=0.02 if dim > 256 else 0.3)
    grads = gb.grouped_swiglu_backward_emulated(*args)
    assert [g.dtype for g in grads] == [args[1].dtype, args[3].dtype, args[4].dtype, args[5].dtype]
    assert gradient_problems(grads, float64_derivative(*args), torchtitan_derivative(*args)) == []


@pytest.mark.parametrize("case", list(CASES))
def test_nki_backward_on_the_emulator_matches_float64_and_torchtitan(case):
    _check_case(*CASES[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SLOW_CASES))
def test_nki_backward_at_the_30b_dims_matches_float64_and_torchtitan(case):
    _check_case(*SLOW_CASES[case])


@pytest.mark.slow
def test_nki_backward_at_the_30b_a3b_cut_matches_float64_and_torchtitan():
    """The source's cut per rank: 2048 tokens x top-4 = 8192 routed rows, D 2048, F 768, 64
    experts, a balanced routing (about 2 minutes of one core for the emulated backward, and
    about 10 GB for the float64 derivative)."""
    args = _inputs((128,) * 64, 2048, 768, weight_std=0.02)
    grads = gb.grouped_swiglu_backward_emulated(*args)
    assert gradient_problems(grads, float64_derivative(*args), torchtitan_derivative(*args)) == []


# ------------------------------------------------------------------ the checks can fail


def _emulated_with_block(block):
    forward, backward = gb.emulated_calls()
    return lambda *args: gb.grouped_swiglu_backward_via(forward, backward, *args, block=block)


def test_blocks_of_128_rows_at_lnc2_leave_gradients_unwritten():
    """nki-library's validate admits block_size 128, but at LNC=2 each program takes
    ``NUM_B_TILES // 2 = 0`` of a block's 128-row tiles: the down-projection gradient is never
    written, and the emulator's poisoned memory makes every gradient NaN."""
    args = _inputs(*CASES["four_experts_padded_F"][:3])
    grads = _emulated_with_block(128)(*args)
    assert any(bool(g.isnan().any()) for g in grads)
    assert gradient_problems(grads, float64_derivative(*args), torchtitan_derivative(*args))


def test_swapped_gate_and_up_gradients_fail():
    args = _inputs(*CASES["four_experts_padded_F"][:3])
    dx, dw1, dw2, dw3 = gb.grouped_swiglu_backward_emulated(*args)
    problems = gradient_problems((dx, dw3, dw2, dw1), float64_derivative(*args), torchtitan_derivative(*args))
    assert [p.split(":")[0] for p in problems] == ["dw1", "dw1", "dw3", "dw3"]


# ------------------------------------------------------------------ the op's backward is this kernel's


def test_the_ops_autograd_calls_the_backward_op_the_neuron_registration_fills(monkeypatch):
    """``harness::grouped_swiglu``'s autograd calls ``harness::grouped_swiglu_backward`` (the op
    harness.kernels.ops.neuron gives the NKI kernel on 'neuron'): with that op swapped for the emulated
    NKI backward, autograd through the forward op returns the NKI gradients bit for bit."""
    grad, x, offsets, w1, w2, w3 = _inputs((3, 0, 4, 2), 64, 32)
    nki = gb.grouped_swiglu_backward_emulated(grad, x, offsets, w1, w2, w3)
    calls = []

    def emulated(*args):
        calls.append(len(args))
        return gb.grouped_swiglu_backward_emulated(*args)

    monkeypatch.setattr(torch.ops.harness, "grouped_swiglu_backward", emulated)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w1, w2, w3)]
    y = torch.ops.harness.grouped_swiglu(leaves[0], offsets, *leaves[1:])
    got = torch.autograd.grad(y, leaves, grad)
    assert calls == [6] and all(torch.equal(a, b) for a, b in zip(got, nki, strict=True))


def dst_rmw_uses(run, monkeypatch, seen: list | None = None) -> tuple[int, int]:
    """(DMAs passing ``dst_rmw_op``, DMAs) issued on the emulator while ``run()`` runs (the
    emulator refuses ``dst_rmw_op``: rule dma-rmw)."""
    isa = install._emulator_modules()["nki.isa"]
    real, seen = isa.dma_copy, ([] if seen is None else seen)

    def recording(*args, **kwargs):
        seen.append("dst_rmw_op" in kwargs)
        return real(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(isa, "dma_copy", recording)
        run()
    return sum(seen), len(seen)


def test_no_instruction_of_the_backward_uses_dst_rmw_op(monkeypatch):
    """NKI 0.3 removed ``dma_copy(dst_rmw_op=...)`` and the emulator refuses it (rule dma-rmw):
    the backward's kernels run to the end on the emulator, and none of their DMAs passes it."""
    uses, total = dst_rmw_uses(lambda: gb.grouped_swiglu_backward_emulated(*_inputs((3, 0, 4, 2), 64, 32)), monkeypatch)
    assert total > 100 and uses == 0


def test_the_dst_rmw_op_count_sees_a_kernel_that_uses_it(monkeypatch):
    """The check above can fail: a kernel that passes ``dst_rmw_op`` is refused (dma-rmw), and the
    count sees its DMA."""
    def accumulate(src):
        nl, isa = (nki_emu.install._emulator_modules()[m] for m in ("nki.language", "nki.isa"))
        tile = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
        isa.dma_copy(dst=tile, src=src)
        out = nl.ndarray((1, 4), nl.float32, buffer=nl.shared_hbm)
        isa.dma_copy(dst=out, src=src)
        isa.dma_copy(dst=out, src=tile, dst_rmw_op=nl.add)
        return out

    seen: list[bool] = []
    with pytest.raises(nki_emu.RuleViolation, match="dma-rmw"):
        dst_rmw_uses(lambda: nki_emu.run(accumulate)(torch.ones(1, 4)), monkeypatch, seen)
    assert (sum(seen), len(seen)) == (1, 3)


# ------------------------------------------------------------------ nki-library's EA grad race (known issue)


def _race_case():
    args = _inputs(*CASES["two_blocks_for_one_expert"][:3])
    forward, backward = gb.emulated_calls()
    grads = gb.grouped_swiglu_backward_via(forward, backward, *args)
    return args, grads, backward.races


def test_the_ea_grad_race_is_exactly_the_known_issue_and_the_gradients_hold():
    """nki-library's backward races on its EA grad at LNC=2 (known issue nkilib-bwd-ea-grad-lnc-race):
    the emulator records it, every race is the EA grad [T*E, 1] at elements the other program's
    zeroing covers (T = 321 tokens, E = 3: 175.0 vs 0.0 at index 321), and every gradient the path
    returns still meets the tolerances."""
    args, grads, races = _race_case()
    tokens, experts = args[1].shape[0] + 1, args[3].shape[0]
    assert races and all(gb.ea_grad_race(r, tokens, experts, 2) == gb.EA_GRAD_RACE for r in races)
    assert {(r.kind, r.shape) for r in races} == {("write-write", (tokens * experts, 1))}
    assert known_issues.issue("nkilib-bwd-ea-grad-lnc-race").signature.equals == gb.EA_GRAD_RACE
    assert gradient_problems(grads, float64_derivative(*args), torchtitan_derivative(*args)) == []


def test_a_race_other_than_the_known_one_is_refused():
    """The settling can fail: the same race on another tensor shape, or with the zero on the
    program whose zeroing does not cover the element, is not the known issue."""
    args, _, races = _race_case()
    tokens, experts = args[1].shape[0] + 1, args[3].shape[0]
    race = races[0]
    other_shape = dataclasses.replace(race, shape=(tokens, experts))
    swapped = dataclasses.replace(race, theirs=race.mine, mine=race.theirs)
    for wrong in (other_shape, swapped):
        assert gb.ea_grad_race(wrong, tokens, experts, 2) != gb.EA_GRAD_RACE
        with pytest.raises(RuleViolation, match="not as known issue nkilib-bwd-ea-grad-lnc-race"):
            gb.settle_races([wrong], tokens, experts, 2)


def test_at_lnc1_the_race_case_has_no_race_and_every_gradient_holds():
    """One program (grid ()) zeroes every expert before it stores: no race, all gradients checked."""
    args = _inputs(*CASES["two_blocks_for_one_expert"][:3])
    forward, backward = gb.emulated_calls(programs=1)
    grads = gb.grouped_swiglu_backward_via(forward, backward, *args, programs=1)
    assert backward.races == []
    assert gradient_problems(grads, float64_derivative(*args), torchtitan_derivative(*args)) == []

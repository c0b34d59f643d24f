"""The NKI backward of ``harness::grouped_swiglu``: nki-library's blockwise MoE backward
(``experimental/moe/bwd/blockwise_mm_backward.blockwise_mm_bwd``, run unchanged) fed from our
forward kernel's recompute. NOT YET RUN ON HARDWARE.

``grouped_swiglu_backward_via(forward, backward, grad, x, offsets, w1, w2, w3)`` ->
``(dx, dw1, dw2, dw3)``, on every device the calls run on (the Neuron kernels, the emulator's):

1. D and F are zero-padded to the sizes both kernels take (``backward_size``: <= 128 or a
   multiple of 128 for our forward, a multiple of 64 for the backward, whose two programs each
   take half of D and of F in multiples of 32 for its DMA transposes). Zero features add nothing
   to any product, silu(0) * 0 = 0, and their gradients are dropped;
2. the weights go to nki-library's layout once (``weight_layout``: ``gate_up [E, D, 2, F]``,
   ``down [E, F, D]``); both kernels read that copy;
3. the activations the backward needs are recomputed, as the CPU backward recomputes them (two
   ``(R, F)`` tensors are not kept from the forward on any device): our
   ``grouped_swiglu_checkpoint_kernel`` at its block size returns ``y`` and the rounded gate and
   up projections ``a``, ``b``;
4. the rows are blocked again at ``BACKWARD_BLOCK = 256`` rows, nki-library's layout: each
   routed row is one "token" whose one expert is its own (affinity 1.0, so the affinity scaling
   is exact and the affinity gradient, computed from ``y``, is dropped); padding positions name
   the zero token ``R``. 256, not 128: at LNC=2 the backward splits each block's 128-row tiles
   between its two programs (``NUM_B_TILES // num_shards``), so a 128-row block leaves the
   down-projection gradient unwritten -- found on the emulator, where the unwritten memory is
   NaN (nki-library's ``validate`` admits 128);
5. ``blockwise_mm_bwd[2]`` (LNC=2) -> ``dx [R+1, D]``, ``d gate_up``, ``d down``, mapped back to
   torchtitan's layouts and dtypes (``dx`` in ``x``'s dtype, each ``dW`` in its weight's).

Rounding differs from torchtitan's (``_grouped_mm`` accumulates each expert's ``dW`` in one
float32 GEMM; the library adds block contributions in bfloat16 HBM): the checks hold it to the
grouped-matmul kernel tolerance against the float64 derivative and torchtitan's
(tests/kernels/test_moe_backward.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.kernels import emu as nki_emu
from harness.kernels.emu import RuleViolation
from harness.kernels.ops import grouped_swiglu as gs
from harness.kernels.ops.nki import grouped_swiglu_kernel as gk
from harness.kernels.ops.nki.simulation import nkilib_module
from harness.registry import known_issues

BACKWARD_BLOCK = 256  # nki-library's backward block size at LNC=2 (see the module docstring)
NKILIB_BACKWARD = "experimental.moe.bwd.blockwise_mm_backward"


def backward_size(n: int) -> int:
    """The smallest size >= ``n`` both kernels take: 64, 128, or a multiple of 128."""
    if n <= 64:
        return 64
    return -(-n // gk.PART) * gk.PART


def _padded(t: Tensor, *sizes: int) -> Tensor:
    """``t`` zero-padded at the end of its last ``len(sizes)`` dims to ``sizes``."""
    if tuple(t.shape[-len(sizes):]) == tuple(sizes):
        return t
    out = t.new_zeros(*t.shape[: t.dim() - len(sizes)], *sizes)
    out[(..., *(slice(0, s) for s in t.shape[-len(sizes):]))] = t
    return out


def _recompute(forward, x, offsets, gate_up, down, programs):
    """(y rows (R, D), gate/up rows (R, 2, F)) from the checkpoint forward at its block size."""
    rows = x.shape[0]
    slots, block_expert = gs.block_layout(offsets, rows)
    num_blocks = block_expert.shape[0]
    x_blocks = gk.to_kernel_blocks(gs.to_blocks(x, slots, num_blocks * gs.BLOCK_SIZE), num_blocks)
    load = gk.weight_loads(block_expert, gate_up.shape[0], programs)
    y_blocks, act_blocks = forward(x_blocks, load, gate_up, down)
    y = gs.from_blocks(gk.from_kernel_blocks(torch.as_tensor(y_blocks)), slots)
    act = gk.activations_from_kernel_blocks(torch.as_tensor(act_blocks))
    act = gs.from_blocks(act.reshape(act.shape[0], -1), slots).reshape(rows, 2, -1)
    return y, act


def backward_layout(offsets: Tensor, rows: int, block: int = BACKWARD_BLOCK):
    """(slots (R,), block_expert (N,) int32, token_position_to_id (N*B,) int32): nki-library's
    blockwise layout of ``rows`` expert-sorted rows, padding positions naming token ``rows``."""
    slots, block_expert = gs.block_layout(offsets, rows, block)
    positions = block_expert.shape[0] * block
    token = torch.full((positions + 1,), rows, dtype=torch.int32, device=offsets.device)
    token[slots] = torch.arange(rows, dtype=torch.int32, device=offsets.device)
    return slots, block_expert, token[:positions]


def one_hot_affinities(offsets: Tensor, rows: int, experts: int) -> Tensor:
    """``[(R+1) * E, 1]`` bfloat16: 1.0 at (row, its expert), 0 elsewhere and on the zero token."""
    owner = torch.searchsorted(offsets.to(torch.int64), torch.arange(rows, device=offsets.device), right=True)
    owned = owner < experts
    affinities = torch.zeros(rows + 1, experts, dtype=torch.bfloat16, device=offsets.device)
    affinities[torch.arange(rows, device=offsets.device)[owned], owner[owned]] = 1
    return affinities.reshape(-1, 1)


def grouped_swiglu_backward_via(forward, backward, grad: Tensor, x: Tensor, offsets: Tensor, w1: Tensor, w2: Tensor,
                                w3: Tensor, programs: int = gk.PROGRAMS,
                                block: int = BACKWARD_BLOCK) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dx, dw1, dw2, dw3)`` of ``harness::grouped_swiglu`` for the upstream ``grad``, with
    ``forward`` = our checkpoint kernel (launched) and ``backward`` = nki-library's
    ``blockwise_mm_bwd`` (launched) at ``block`` rows per block; see the module docstring."""
    rows, dim = x.shape
    experts, hidden, _ = w1.shape
    dim_p, hidden_p = backward_size(dim), backward_size(hidden)
    bf = torch.bfloat16
    x_p = _padded(x.to(bf), dim_p)
    gate_up, down = gk.weight_layout(_padded(w1, hidden_p, dim_p), _padded(w2, dim_p, hidden_p),
                                     _padded(w3, hidden_p, dim_p))
    y, act = _recompute(forward, x_p, offsets, gate_up, down, programs)
    slots, block_expert, token_position_to_id = backward_layout(offsets, rows, block)
    num_blocks, positions = block_expert.shape[0], block_expert.shape[0] * block
    gate_up_act_T = gs.to_blocks(act.reshape(rows, -1), slots, positions).reshape(
        num_blocks, block, 2, hidden_p).permute(0, 2, 3, 1).contiguous()
    down_act = gs.to_blocks(y, slots, positions).reshape(num_blocks, block, dim_p)
    zero_row = x_p.new_zeros(1, dim_p)
    dx, _, d_gate_up, d_down = (torch.as_tensor(t) for t in backward(
        torch.cat((x_p, zero_row)), one_hot_affinities(offsets, rows, experts), gate_up, down, gate_up_act_T, down_act,
        token_position_to_id, block_expert.reshape(-1, 1), torch.cat((_padded(grad.to(bf), dim_p), zero_row)),
        block, is_tensor_update_accumulating=False))
    dw1 = d_gate_up[:, :dim, 0, :hidden].transpose(-2, -1).to(w1.dtype)
    dw3 = d_gate_up[:, :dim, 1, :hidden].transpose(-2, -1).to(w3.dtype)
    dw2 = d_down[:, :hidden, :dim].transpose(-2, -1).to(w2.dtype)
    return dx[:rows, :dim].to(x.dtype).contiguous(), dw1.contiguous(), dw2.contiguous(), dw3.contiguous()


# ------------------------------------------------------------------ the calls per device


def _library_module(device: str):
    if device == "nki-emu":
        return nki_emu.import_module(f"nkilib_src.nkilib.{NKILIB_BACKWARD}")

    return nkilib_module(NKILIB_BACKWARD)


EA_GRAD_RACE = ("write-write lnc-race on expert_affinities_masked_grad [T*E, 1] at elements only the zeroing "
                "program's 0.0 contests")


def ea_grad_race(race, tokens: int, experts: int, programs: int) -> str:
    """What a race the emulator recorded in ``blockwise_mm_bwd`` is: ``EA_GRAD_RACE`` (known issue
    nkilib-bwd-ea-grad-lnc-race) when it is a write-write race on the EA grad ``[T*E, 1]`` and at
    every raced element the program whose value is 0.0 is the one whose expert-sharded zeroing
    (bwmm_bwd_dropless.py: flat slice ``[e*T, (e+1)*T)`` for its ``E // programs`` experts; with
    ``E == 1`` every program zeroes the whole tensor) covers
    it, the other's value its EA grad store; else a description of what it is instead."""
    what = f"{race.kind} race on {race.tensor or 'a tensor'} {list(race.shape)}"
    if race.kind != "write-write" or tuple(race.shape) != (tokens * experts, 1):
        return what
    if experts == 1:  # every program zeroes the whole tensor (shard_E = 1, e_offset = 0)
        theirs_zeroes = mine_zeroes = torch.ones_like(race.elements, dtype=torch.bool)
    else:
        zeroing = race.elements // tokens // (experts // programs)  # programs past the last zero nothing
        theirs_zeroes, mine_zeroes = race.writers == zeroing, zeroing == race.program
    zero_is_zeroing = ((theirs_zeroes & (race.theirs == 0) & (race.mine != 0))
                       | (mine_zeroes & (race.mine == 0) & (race.theirs != 0)))
    if not bool(zero_is_zeroing.all()):
        bad = int((~zero_is_zeroing).nonzero()[0, 0])
        return (f"{what}: element {int(race.elements[bad])} is not one the zeroing program's 0.0 contests "
                f"(programs {int(race.writers[bad])} and {race.program}: {float(race.theirs[bad])} vs "
                f"{float(race.mine[bad])})")
    return EA_GRAD_RACE


def settle_races(races, tokens: int, experts: int, programs: int) -> list:
    """The races of a ``blockwise_mm_bwd`` launch recorded by the emulator, judged against the known
    issues (check "nki_emu_race"): each must be the known EA grad race, else RuleViolation."""
    for race in races:
        verdict = known_issues.judge("nki_emu_race", race.message,
                                     {"race": ea_grad_race(race, tokens, experts, programs)},
                                     op="grouped_swiglu_backward", impl="nkilib_blockwise_mm_bwd")
        if verdict.status != "known":
            raise RuleViolation("lnc-race", verdict.message)
    return list(races)


def emulated_backward(programs: int = gk.PROGRAMS):
    """nki-library's ``blockwise_mm_bwd`` on the harness's NKI emulator, ``programs`` programs,
    races recorded and settled (``settle_races``: only known issue nkilib-bwd-ea-grad-lnc-race
    passes, and its tensor, the EA grad, is one ``grouped_swiglu_backward_via`` drops). The
    settled races of the last call are in the returned function's ``races``."""
    library = _library_module("nki-emu").blockwise_mm_bwd
    traced = nki_emu.trace(library, grid=(programs,) if programs > 1 else (), races="record")

    def call(hidden_states, affinities, gate_up, *args, **kwargs):
        results, report = traced(hidden_states, affinities, gate_up, *args, **kwargs)
        call.races = settle_races(report.races, hidden_states.shape[0], gate_up.shape[0], programs)
        return results

    call.races = []
    return call


def emulated_calls(programs: int = gk.PROGRAMS):
    """(forward, backward) on the harness's NKI emulator, ``programs`` programs each."""
    return gk.emulated("grouped_swiglu_checkpoint_kernel", programs), emulated_backward(programs)


def grouped_swiglu_backward_emulated(grad, x, offsets, w1, w2, w3):
    """CPU: the backward's kernels on the harness's NKI emulator, LNC=2."""
    return grouped_swiglu_backward_via(*emulated_calls(), grad, x, offsets, w1, w2, w3)


def grouped_swiglu_backward_neuron(grad, x, offsets, w1, w2, w3):
    """The 'neuron' device kernel of ``harness::grouped_swiglu_backward`` (registered by
    harness.kernels.ops.neuron): both kernels at LNC=2 on Neuron tensors; no host read of the routing."""
    library = _library_module("neuron").blockwise_mm_bwd
    return grouped_swiglu_backward_via(gk.launched(gk.grouped_swiglu_checkpoint_kernel), gk.launched(library),
                                       grad, x, offsets, w1, w2, w3)

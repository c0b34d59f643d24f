"""The bridges over the NKI emulator's open gaps (harness/ops/nki/emu_gaps.py) that the MoE kernels
need: each implements what the Neuron 2.33 page it cites states, is installed only inside
``bridged()``, and only while the emulator still lacks the API (probed by behaviour).

Specification, per gap:
- ``dma_transpose``: dst = src permuted (1, 0) / (3, 1, 2, 0); a dst of the wrong shape is refused;
- ``core_barrier``: the programs of a launch run interleaved at every barrier, so what one
  program writes before the barrier the other reads after it; without the barrier the read is of
  memory nothing wrote (poison); a program that ends while another waits is a deadlock, raised;
- ``silu_dx``: the derivative of SiLU;
- ``oob_skip``: an out-of-bounds scalar-offset DMA moves nothing and leaves dst as it was; an
  in-bounds one moves;
- ``address``: a tile pinned at an address is allocated;
- outside ``bridged()`` the emulator is as it was.
"""

from __future__ import annotations

import pytest
import torch

from harness import nki_emu
from harness.nki_emu import install
from harness.ops.nki import emu_gaps


def _nl_isa():
    modules = install._emulator_modules()
    return modules["nki.language"], modules["nki.isa"]


def test_every_open_gap_is_documented_and_its_probe_fails_unbridged():
    assert set(emu_gaps.gaps()) <= set(emu_gaps.GAPS) == set(emu_gaps.PROBES)
    for gap in emu_gaps.gaps():
        assert not emu_gaps.PROBES[gap](), gap


def test_outside_the_block_the_emulator_is_unchanged():
    nl, isa = _nl_isa()
    before = {name: getattr(isa, name) for name in ("dma_transpose", "core_barrier", "dma_copy")}
    with emu_gaps.bridged():
        pass
    assert {name: getattr(isa, name) for name in before} == before and nl.ndarray is install._emulator_modules()[
        "nki.language"].ndarray


def _transpose(src_shape, dst_shape):
    nl, isa = _nl_isa()

    def body(src):
        tile = nl.ndarray(dst_shape, nl.bfloat16, buffer=nl.sbuf)
        isa.dma_transpose(dst=tile, src=src)
        out = nl.ndarray(dst_shape, nl.bfloat16, buffer=nl.shared_hbm)
        isa.dma_copy(dst=out, src=tile)
        return out

    return body


@pytest.mark.parametrize("src_shape,permutation", [((3, 5), (1, 0)), ((4, 1, 1, 6), (3, 1, 2, 0))])
def test_dma_transpose_permutes_as_documented(src_shape, permutation):
    src = torch.randn(src_shape).bfloat16()
    dst_shape = tuple(src_shape[p] for p in permutation)
    out = emu_gaps.run(_transpose(src_shape, dst_shape))(src)
    assert torch.equal(out, src.permute(permutation))


def test_dma_transpose_refuses_a_dst_of_the_wrong_shape():
    with pytest.raises(nki_emu.RuleViolation, match="dma-size"):
        emu_gaps.run(_transpose((3, 5), (3, 5)))(torch.zeros(3, 5).bfloat16())


def test_programs_meet_at_the_barrier_and_read_what_the_other_wrote():
    nl, isa = _nl_isa()
    assert torch.equal(emu_gaps.run(emu_gaps.barrier_exchange(nl, isa), grid=(2,))(), emu_gaps.BARRIER_HELD)


def test_without_the_barrier_a_program_reads_memory_nothing_wrote(monkeypatch):
    """The check above can fail: the barrier turned into a no-op, program 0 reads program 1's half
    before program 1 ran."""
    nl, isa = _nl_isa()
    monkeypatch.setattr(emu_gaps, "_core_barrier", lambda *args, **kwargs: None)
    result = emu_gaps.run(emu_gaps.barrier_exchange(nl, isa), grid=(2,))()
    assert bool(result[0, 1].isnan()) and torch.equal(result[1], emu_gaps.BARRIER_HELD[1])


def test_a_program_that_never_reaches_the_barrier_is_a_deadlock():
    nl, isa = _nl_isa()

    def body():
        shared = nl.ndarray((1, 2), nl.float32, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            isa.core_barrier(shared, (0, 1))
        return shared

    with pytest.raises(RuntimeError, match="deadlock"):
        emu_gaps.run(body, grid=(2,))()


def test_silu_dx_is_the_derivative_of_silu():
    nl, isa = _nl_isa()
    x = torch.linspace(-6, 6, 64).reshape(1, 64)

    def body(data):
        tile = nl.ndarray((1, 64), nl.float32, buffer=nl.sbuf)
        isa.dma_copy(dst=tile, src=data)
        out_tile = nl.ndarray((1, 64), nl.float32, buffer=nl.sbuf)
        isa.activation(dst=out_tile, op=nl.silu_dx, data=tile)
        out = nl.ndarray((1, 64), nl.float32, buffer=nl.shared_hbm)
        isa.dma_copy(dst=out, src=out_tile)
        return out

    leaf = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(torch.nn.functional.silu(leaf).sum(), leaf)
    torch.testing.assert_close(emu_gaps.run(body)(x), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("index,moves", [(1, True), (3, False)], ids=["in_bounds", "out_of_bounds"])
def test_an_out_of_bounds_dma_with_oob_skip_moves_nothing(index, moves):
    nl, isa = _nl_isa()
    table = torch.arange(6, dtype=torch.float32).reshape(3, 2)

    def body(src, which):
        row = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        isa.dma_copy(dst=row, src=which)
        tile = nl.ndarray((1, 2), nl.float32, buffer=nl.sbuf)
        isa.memset(tile, -1.0)
        isa.dma_copy(dst=tile, src=src.ap([[2, 1], [1, 2]], offset=0, scalar_offset=row, indirect_dim=0),
                     oob_mode=isa.oob_mode.skip)
        out = nl.ndarray((1, 2), nl.float32, buffer=nl.shared_hbm)
        isa.dma_copy(dst=out, src=tile)
        return out

    out = emu_gaps.run(body)(table, torch.tensor([[index]], dtype=torch.int32))
    assert torch.equal(out, table[index:index + 1] if moves else torch.full((1, 2), -1.0))


def test_a_tile_pinned_at_an_address_is_allocated():
    nl, _ = _nl_isa()
    with emu_gaps.bridged():
        _, report = nki_emu.trace(lambda: nl.ndarray((128, 1), nl.float32, buffer=nl.psum, address=(0, 2048)))()
    assert report.peak_psum_bytes_per_partition == 4

"""The NKI emulator's instructions that the MoE kernels (harness/kernels/ops/nki/) use beyond the
common subset: ``dma_transpose``, ``core_barrier``, ``silu_dx``, the out-of-bounds skipping DMA
(``oob_skip``) and tiles pinned at an address. Each is checked as behaviour of the emulator
itself, with the kernel that violates its rule and the kernel at the limit.

Specification, per instruction:
- ``dma_transpose``: dst = src permuted (1, 0) / (3, 1, 2, 0); a dst of another size is refused
  (rule dma-size);
- ``core_barrier``: the programs of a launch run interleaved at every barrier, so what one program
  writes before the barrier the other reads after it; without the barrier the second program's
  read of the first's write is an ``lnc-race`` and (races recorded) the first program read memory
  nothing wrote (poison); a program that ends while another waits is refused (rule core-barrier);
- ``silu_dx``: the derivative of SiLU;
- ``oob_skip``: an out-of-bounds scalar-offset DMA moves nothing and leaves dst as it was (its bytes
  are counted as skipped); an in-bounds one moves;
- ``address``: a tile pinned at an address is allocated and counted live once written; one that
  does not fit the memory, or a read of a pinned tile another tile pinned over it overwrote, is
  refused (rule pinned-address).
"""

from __future__ import annotations

import pytest
import torch

from harness.kernels import emu as nki_emu
from harness.kernels.emu import install


def _nl_isa():
    modules = install._emulator_modules()
    return modules["nki.language"], modules["nki.isa"]


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
    out = nki_emu.run(_transpose(src_shape, dst_shape))(src)
    assert torch.equal(out, src.permute(permutation))


def test_dma_transpose_refuses_a_dst_of_the_wrong_shape():
    """A dst of another size than src's is refused (the emulator admits any dst of src's size, as
    the DMA's access patterns do: nki-library passes reshaped dsts)."""
    with pytest.raises(nki_emu.RuleViolation, match="dma-size"):
        nki_emu.run(_transpose((3, 5), (5, 2)))(torch.zeros(3, 5).bfloat16())


def barrier_exchange(nl, isa, barrier: bool = True):
    """A two-program kernel body: each program writes its half of a shared tensor, both meet at a
    barrier, then program p reads the whole tensor into row p of the result: ``[[1., 2.],
    [1., 2.]]`` when the barrier holds."""

    def body():
        shared = nl.ndarray((1, 2), nl.float32, buffer=nl.shared_hbm)
        out = nl.ndarray((2, 2), nl.float32, buffer=nl.shared_hbm)
        me = nl.program_id(0)
        mine = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        isa.memset(mine, float(me + 1))
        isa.dma_copy(dst=shared[0:1, me:me + 1], src=mine)
        if barrier:
            isa.core_barrier(shared, (0, 1))
        both = nl.ndarray((1, 2), nl.float32, buffer=nl.sbuf)
        isa.dma_copy(dst=both, src=shared)
        isa.dma_copy(dst=out[me:me + 1, 0:2], src=both)
        return out

    return body


BARRIER_HELD = torch.tensor([[1.0, 2.0], [1.0, 2.0]])


def test_programs_meet_at_the_barrier_and_read_what_the_other_wrote():
    nl, isa = _nl_isa()
    assert torch.equal(nki_emu.run(barrier_exchange(nl, isa), grid=(2,))(), BARRIER_HELD)


def test_without_the_barrier_a_program_reads_memory_nothing_wrote():
    """The check above can fail: without the barrier program 1 reads program 0's write in the same
    epoch (lnc-race); with the races recorded, program 0 read program 1's half before it was
    written (poison)."""
    nl, isa = _nl_isa()
    with pytest.raises(nki_emu.RuleViolation, match="lnc-race"):
        nki_emu.run(barrier_exchange(nl, isa, barrier=False), grid=(2,))()
    result, report = nki_emu.trace(barrier_exchange(nl, isa, barrier=False), grid=(2,), races="record")()
    assert bool(result[0, 1].isnan()) and torch.equal(result[1], BARRIER_HELD[1])
    assert [(r.kind, r.shape, r.elements.tolist()) for r in report.races] == [("read", (1, 2), [0])]


def test_a_program_that_never_reaches_the_barrier_is_a_deadlock():
    nl, isa = _nl_isa()

    def body():
        shared = nl.ndarray((1, 2), nl.float32, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            isa.core_barrier(shared, (0, 1))
        return shared

    with pytest.raises(nki_emu.RuleViolation, match="core-barrier.*finished without reaching it"):
        nki_emu.run(body, grid=(2,))()


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
    torch.testing.assert_close(nki_emu.run(body)(x), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("index,moves", [(2, True), (3, False)], ids=["last_in_bounds", "out_of_bounds"])
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

    out, report = nki_emu.trace(body)(table, torch.tensor([[index]], dtype=torch.int32))
    assert torch.equal(out, table[index:index + 1] if moves else torch.full((1, 2), -1.0))
    assert report.dma_bytes_skipped == (0 if moves else 8)


def _pinned(address, shape=(128, 1), overwrite=False):
    nl, isa = _nl_isa()

    def body():
        tile = nl.ndarray(shape, nl.float32, buffer=nl.psum, address=address)
        isa.memset(tile, 1.0)
        if overwrite:
            other = nl.ndarray(shape, nl.float32, buffer=nl.psum, address=address)
            isa.memset(other, 2.0)
        copy = nl.ndarray(shape, nl.float32, buffer=nl.sbuf)
        isa.tensor_copy(dst=copy, src=tile)
        return None

    return nki_emu.trace(body)()[1]


@pytest.mark.parametrize("address", [(0, 2048), (0, 16384 - 4)], ids=["bank_1", "last_byte"])
def test_a_tile_pinned_at_an_address_is_allocated(address):
    assert _pinned(address).peak_psum_bytes_per_partition == 4


@pytest.mark.parametrize("address,shape", [((0, 16384), (128, 1)), ((1, 0), (128, 1))],
                         ids=["past_the_bytes", "past_the_partitions"])
def test_a_pinned_tile_outside_the_memory_is_refused(address, shape):
    with pytest.raises(nki_emu.RuleViolation, match="pinned-address"):
        _pinned(address, shape)


def test_reading_a_pinned_tile_another_pinned_tile_overwrote_is_refused():
    with pytest.raises(nki_emu.RuleViolation, match="pinned-address"):
        _pinned((0, 2048), overwrite=True)


def _int32_transpose(dge_mode: str):
    nl, isa = _nl_isa()

    def body(src):
        tile = nl.ndarray((src.shape[1], src.shape[0]), nl.int32, buffer=nl.sbuf)
        isa.dma_transpose(dst=tile, src=src, dge_mode=getattr(isa.dge_mode, dge_mode))
        out = nl.ndarray(tile.shape, nl.int32, buffer=nl.shared_hbm)
        isa.dma_copy(dst=out, src=tile)
        return out

    return body


def test_dma_transpose_moves_4_byte_elements_unless_hardware_dge_is_asked_for():
    """The docs' 2-byte limit is the hardware DGE's (dge_mode=hwdge) and the indirect transpose's:
    at dge_mode=unknown the compiler picks a mode that moves int32 (nki-library's moe_cte_utils
    transposes int32 token indices so)."""
    src = torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4) * 1000003
    assert torch.equal(nki_emu.run(_int32_transpose("unknown"))(src), src.T)
    with pytest.raises(nki_emu.RuleViolation, match="dma-size"):
        nki_emu.run(_int32_transpose("hwdge"))(src)

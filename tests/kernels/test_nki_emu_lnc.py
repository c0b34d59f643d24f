"""LNC=2 on the NKI emulator: the two programs of a launch run together (harness/kernels/emu/
programs.py), ordered only by nki.isa.core_barrier and nki.isa.sendrecv, and a race between
them on shared HBM fails (harness/kernels/emu/races.py, rule lnc-race), whatever order the
emulator happened to run them in.

The kernel of the docs' use case (nki.isa.core_barrier): each core writes its half of a shared
HBM tensor, a barrier, then each reads the other's half. With the barrier it is right; without
it, it is a race: under the emulator's old schedule (program 0 to the end, then program 1)
program 1 read program 0's finished half and the kernel passed, on hardware either read may
come first.
"""

from __future__ import annotations

import pytest
import torch

from harness.kernels import emu as nki_emu
from harness.kernels.emu import isa as nisa
from harness.kernels.emu import language as nl
from harness.kernels.emu.rules import RuleViolation


def _swap_halves(barrier: bool):
    """out[half p] = the other program's half of x, passed through a shared HBM scratch."""
    def kernel(x):
        rows = x.shape[0] // 2
        me = nl.program_id(0)
        other = 1 - me
        scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[me * rows:(me + 1) * rows, :])
        nisa.dma_copy(dst=scratch[me * rows:(me + 1) * rows, :], src=t)
        if barrier:
            nisa.core_barrier(scratch, (0, 1))
        got = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=got, src=scratch[other * rows:(other + 1) * rows, :])
        nisa.dma_copy(dst=out[me * rows:(me + 1) * rows, :], src=got)
        return out

    return kernel


def _x():
    return torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4)


def test_a_barrier_orders_the_two_programs():
    x = _x()
    out, report = nki_emu.trace(_swap_halves(True), grid=(2,))(x)
    assert report.programs == 2 and torch.equal(out, torch.cat([x[4:], x[:4]]))


def test_the_same_kernel_without_its_barrier_is_a_race():
    with pytest.raises(RuleViolation, match=r"'lnc-race'.*program \(1,\) reads what program \(0,\) wrote"):
        nki_emu.run(_swap_halves(False), grid=(2,))(_x())


def test_a_barrier_one_program_never_reaches_fails_naming_both():
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.core_barrier(out, (0, 1))  # program 1 never gets here
        return out

    with pytest.raises(RuleViolation, match=r"'core-barrier'.*program \(0,\) waits .* program\(s\) \[1\] finished"):
        nki_emu.run(kernel, grid=(2,))(_x())


def _write_own_id(same: bool):
    """Both programs write the whole output: their ids (a race), or the same values (a kernel
    that does not split its work: the same result in either order)."""
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=0.0 if same else float(nl.program_id(0)))
        nisa.dma_copy(dst=out, src=t)
        return out

    return kernel


def test_programs_that_leave_different_values_are_a_race():
    with pytest.raises(RuleViolation, match=r"'lnc-race'.*leave different values"):
        nki_emu.run(_write_own_id(False), grid=(2,))(_x())


def test_programs_that_write_the_same_values_are_not_a_race():
    assert torch.equal(nki_emu.run(_write_own_id(True), grid=(2,))(_x()), _x())


def test_sendrecv_exchanges_tiles_between_the_programs():
    def kernel(x):
        me = nl.program_id(0)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        mine = nl.ndarray((4, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        theirs = nl.ndarray((4, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=mine, src=x[me * 4:(me + 1) * 4, :])
        nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - me, recv_from_rank=1 - me, pipe_id=0)
        nisa.dma_copy(dst=out[me * 4:(me + 1) * 4, :], src=theirs)
        return out

    x = _x()
    assert torch.equal(nki_emu.run(kernel, grid=(2,))(x), torch.cat([x[4:], x[:4]]))


def test_a_barrier_on_an_sbuf_tile_is_refused():
    """nki.isa.core_barrier's docs: "The data parameter represents the shared data that all cores
    need to synchronize on. This must be data in shared HBM that multiple cores are accessing."
    (nki-library's moe_cte shard_on_i_hybrid passes its SBUF block index; known issue
    nkilib-core-barrier-on-sbuf-tile.) The same kernel on a shared HBM tensor passes."""
    def kernel(x, on_sbuf: bool):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        index = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(index, value=0)
        nisa.core_barrier(index if on_sbuf else out, (0, 1))
        return out

    nki_emu.run(lambda x: kernel(x, False), grid=(2,))(_x())
    with pytest.raises(RuleViolation, match=r"'core-barrier'.*data is in nl.sbuf"):
        nki_emu.run(lambda x: kernel(x, True), grid=(2,))(_x())

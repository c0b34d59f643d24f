"""Races between the programs of an LNC=2 launch, on the HBM they share.

Two NeuronCores order their accesses to shared HBM only through ``nki.isa.core_barrier``
(its docs' use case: each core writes its part, a barrier, then both read). The scheduler
(``programs.py``) runs one program until it waits at a barrier or ends, so when a program runs
in an epoch (between two barriers), the programs before it have finished that epoch. Per
element of a shared HBM tensor a concurrent launch writes, ``Writes`` keeps the program that
last wrote it and the barrier epoch of that write, and ``RuleViolation("lnc-race")`` is raised
when, in one epoch,

- a program reads an element another program wrote (on hardware the read may come before or
  after that write), or
- the programs leave an element with different last values (its final value depends on which
  core writes last): checked when the later program ends the epoch.

Two programs writing the same values (a kernel that does not split its work, run at LNC=2),
or one overwriting the other's value and then writing it back, are not races: every order
ends with the same contents. A program overwriting what another only read in the same epoch
is not tracked (the reader ran first and saw the old value, one of the hardware's orders).

A launch with ``races="record"`` (``harness.kernels.emu.trace``/``run``) does not raise: each race
becomes a ``Race`` in the report's ``races`` and the launch runs on (the values left are the
scheduler's order's), so a caller can settle a race it knows (an upstream kernel's, by its
known issue's signature) and still check every output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.kernels.emu import cost
from harness.kernels.emu.rules import RuleViolation

MODES = ("raise", "record")


@dataclass
class Race:
    """One race of a launch run with ``races="record"``."""

    kind: str  # "write-write" (different last values) or "read" (a read of what another wrote)
    tensor: str  # the storage's name ("" when unnamed)
    shape: tuple[int, ...]  # the shared HBM tensor's shape
    elements: torch.Tensor  # flat indices into it of the raced elements
    writers: torch.Tensor  # per element, the index of the program whose write it contests
    program: int  # the index of the program that took the elements over (write) or read them
    theirs: torch.Tensor | None  # write-write: per element, the other program's value
    mine: torch.Tensor | None  # write-write: per element, this program's value
    epoch: int
    message: str


def _violation(program: cost.Program, race: Race) -> None:
    if getattr(program.trace, "races", "raise") == "record":
        program.trace.report.races.append(race)
        return
    raise RuleViolation("lnc-race", race.message)


class Writes:
    def __init__(self, numel: int):
        self.program = torch.full((numel,), -1, dtype=torch.int8)
        self.epoch = torch.zeros(numel, dtype=torch.int32)

    def _marks(self, view):
        if view.dynamic is None:
            strided = (view.shape, view.strides, view.offset)
            return torch.as_strided(self.program, *strided), torch.as_strided(self.epoch, *strided)
        index = view.addresses()
        return self.program[index], self.epoch[index]

    def _conflicts(self, view, program: cost.Program):
        writer, epoch = self._marks(view)
        return (writer >= 0) & (writer != program.index) & (epoch == program.epoch), writer

    def read(self, view) -> None:
        program = cost.active()
        conflict, writer = self._conflicts(view, program)
        if bool(conflict.any()):
            at = tuple(int(i) for i in conflict.nonzero()[0])
            other = program.trace.program_ids[int(writer[at])]
            message = (f"at {program.where()}, program {program.id} reads what program {other} "
                       f"wrote, with no nki.isa.core_barrier between: {view!r}, element {at} of the view "
                       f"({int(conflict.sum())} element(s), barrier epoch {program.epoch})")
            _violation(program, Race("read", view.storage.name, tuple(view.storage.shape),
                                     view.addresses()[conflict].reshape(-1), writer[conflict].reshape(-1),
                                     program.index, None, None, program.epoch, message))

    def write(self, view, values: torch.Tensor) -> None:
        program = cost.active()
        conflict, writer = self._conflicts(view, program)
        index = view.addresses() if view.dynamic is not None or bool(conflict.any()) else None
        if index is not None and bool(conflict.any()):
            contested = index[conflict]
            program.contested.append((view.storage, contested, view.storage.data[contested].clone(),
                                      writer[conflict].clone()))
        if view.dynamic is None:
            strided = (view.shape, view.strides, view.offset)
            torch.as_strided(self.program, *strided).fill_(program.index)
            torch.as_strided(self.epoch, *strided).fill_(program.epoch)
        else:
            self.program[index] = program.index
            self.epoch[index] = program.epoch


def settle(program: cost.Program) -> None:
    """At the end of an epoch: the elements this program took over from another program in it
    must end with the other program's values (else the final contents depend on the order)."""
    contested, program.contested = program.contested, []
    for storage, index, theirs, writer in contested:
        mine = storage.data[index]
        same = ((mine == theirs) | (torch.isnan(mine) & torch.isnan(theirs)) if mine.is_floating_point()
                else mine == theirs)
        if not bool(same.all()):
            first = int((~same).nonzero()[0, 0])
            other = program.trace.program_ids[int(writer[first])]
            name = f" {storage.name!r}" if storage.name else ""
            message = (f"programs {other} and {program.id} leave different values in shared HBM "
                       f"tensor{name} {list(storage.shape)} with no nki.isa.core_barrier between their writes: "
                       f"{int((~same).sum())} element(s), first at flat index {int(index[first])} "
                       f"({float(theirs[first])} vs {float(mine[first])}), barrier epoch {program.epoch}")
            differ = ~same
            _violation(program, Race("write-write", storage.name, tuple(storage.shape), index[differ],
                                     writer[differ], program.index, theirs[differ], mine[differ], program.epoch,
                                     message))

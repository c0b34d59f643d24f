"""What a traced kernel does: the cost report, and the state of a launch and its programs.

A ``Trace`` is one launch (all programs of its SPMD grid); a ``Program`` is one program of it
(one NeuronCore: its own SBUF and PSUM, its own clock). ``active()`` is the program running on
this thread. Every ISA call records one instruction on its engine and advances its program's
clock; DMA bytes are the destination's bytes; FLOPs count 2*K*M*N per nc_matmul and one per
output element of every other compute instruction.

On-chip footprint, in the kernel's order: a value in an SBUF tile is live from the instruction
that writes it to the last one that reads it; a PSUM tile from its first write to its last (an
eviction may run right after the last matmul: the scheduler moves independent instructions
up, docs of ``nl.no_reorder``); ``tensors.Storage.touch``. The peak of the bytes the live
tiles hold (partitions x bytes per partition: a tile of fewer than 128 partitions may be
placed beside another) is checked against trn2's capacity when the program ends (``rules``:
sbuf-capacity, psum-capacity) and reported per partition (peak bytes / 128). HBM is what the kernel allocates
plus its arguments.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclass
class CostReport:
    instructions: Counter = field(default_factory=Counter)  # by engine
    opcodes: Counter = field(default_factory=Counter)  # by nki.isa name
    dma_bytes: int = 0  # the bytes the DMA instructions address
    dma_bytes_skipped: int = 0  # of those, the bytes an oob_mode.skip DMA did not move (numerics only)
    dma_transfers: int = 0
    matmul_flops: int = 0
    other_flops: int = 0
    peak_sbuf_bytes_per_partition: int = 0
    peak_psum_bytes_per_partition: int = 0
    hbm_argument_bytes: int = 0
    hbm_allocated_bytes: int = 0
    programs: int = 1
    numerics: bool = True
    races: list = field(default_factory=list)  # races.Race: a launch with races="record"

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.other_flops

    @property
    def dma_bytes_moved(self) -> int:
        """The bytes the DMAs moved: addressed less those out of bounds under oob_mode.skip (a
        shape-only trace cannot know those: there it equals ``dma_bytes``)."""
        return self.dma_bytes - self.dma_bytes_skipped

    @property
    def instruction_count(self) -> int:
        return sum(self.instructions.values())

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_argument_bytes + self.hbm_allocated_bytes

    def summary(self) -> str:
        engines = ", ".join(f"{e} {self.instructions.get(e, 0)}" for e in ENGINES)
        return (f"{self.instruction_count} instructions ({engines}); DMA {self.dma_bytes} B in {self.dma_transfers} "
                f"transfers; {self.matmul_flops} matmul FLOPs + {self.other_flops} other; peak SBUF "
                f"{self.peak_sbuf_bytes_per_partition} B/partition, PSUM {self.peak_psum_bytes_per_partition} "
                f"B/partition; HBM {self.hbm_bytes} B; {self.programs} program(s)")


class Trace:
    """One emulated kernel launch: its report, its grid and what its programs share."""

    def __init__(self, numerics: bool = True, grid: tuple[int, ...] = (), races: str = "raise"):
        if races not in ("raise", "record"):
            raise ValueError(f"nki emulator: races={races!r}: 'raise' (default) or 'record'")
        self.races = races  # races.py: raise RuleViolation("lnc-race"), or record it in the report
        self.report = CostReport(numerics=numerics)
        self.numerics = numerics
        self.grid = grid
        self.shared: list = []  # shared_hbm storages of an SPMD launch, in allocation order
        self.concurrent = False  # more than one program: HBM accesses are checked for races

    def instruction(self, opcode: str, engine: str, flops: int = 0, matmul: bool = False) -> None:
        self.report.instructions[engine] += 1
        self.report.opcodes[opcode] += 1
        if matmul:
            self.report.matmul_flops += flops
        else:
            self.report.other_flops += flops

    def dma(self, nbytes: int) -> None:
        self.report.dma_bytes += nbytes
        self.report.dma_transfers += 1


class Program:
    """One program of a launch: one NeuronCore with its own SBUF and PSUM."""

    def __init__(self, trace: Trace, program_id: tuple[int, ...] = ()):
        self.trace = trace
        self.id = program_id
        self.index = 0  # position in the launch's program list
        self.clock = 0  # instructions issued so far
        self.epoch = 0  # core barriers passed
        self.shared_counter = 0  # this program's next shared_hbm allocation
        self.opcode = "(allocation)"  # the instruction being issued, for messages
        self.on_chip: list = []  # (storage, kind, bytes over all its partitions): for the liveness check
        self.contested: list = []  # shared HBM elements this program took over in this epoch (races.py)
        self.pinned: dict[str, list] = {}  # per on-chip kind, the pinned tiles whose bytes are still their own

    # the launch's state, seen from the program
    numerics = property(lambda self: self.trace.numerics)
    grid = property(lambda self: self.trace.grid)
    report = property(lambda self: self.trace.report)
    shared = property(lambda self: self.trace.shared)

    def instruction(self, opcode: str, engine: str, flops: int = 0, matmul: bool = False) -> None:
        self.clock += 1
        self.opcode = f"nki.isa.{opcode}"
        self.trace.instruction(opcode, engine, flops, matmul)

    def dma(self, nbytes: int) -> None:
        self.trace.dma(nbytes)

    def allocated(self, storage, kind: str, bytes_per_partition: int, total: int) -> None:
        if kind in ("sbuf", "psum"):
            self.on_chip.append((storage, kind, total))
        elif kind == "argument":
            self.trace.report.hbm_argument_bytes += total
        else:
            self.trace.report.hbm_allocated_bytes += total

    def where(self) -> str:
        at = f"instruction {self.clock} ({self.opcode})"
        return f"{at} of program {self.id}" if self.trace.grid else at

    def live_peaks(self) -> dict[str, tuple[int, int, list]]:
        """Per on-chip kind: (peak bytes of the live tiles, over all their partitions; the clock
        at the peak; the tiles live then). A tile's contents are live from a write to the last
        read of it."""
        peaks = {}
        for kind in ("sbuf", "psum"):
            tiles = [(s, b, _union(s.live)) for s, k, b in self.on_chip if k == kind]
            events = sorted(event for _, b, spans in tiles for start, end in spans
                            for event in ((start, 0, b), (end, 1, -b)))
            live = best = at = 0
            for clock, _, delta in events:
                live += delta
                if live > best:
                    best, at = live, clock
            peaks[kind] = (best, at, [(s, b) for s, b, spans in tiles if any(a <= at <= z for a, z in spans)])
        return peaks


def _union(intervals) -> list[tuple[int, int]]:
    """A storage's live intervals merged: it holds one value at a time."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


_local = threading.local()


def active() -> Program:
    program = getattr(_local, "program", None)
    if program is None:
        raise RuntimeError("nki emulator: no kernel is running; call the kernel through nki.jit "
                           "(or harness.kernels.emu.trace) so it runs on the emulator")
    return program


def running() -> bool:
    return getattr(_local, "program", None) is not None


def set_active(program: Program | None) -> Program | None:
    previous = getattr(_local, "program", None)
    _local.program = program
    return previous

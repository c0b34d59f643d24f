"""What a traced kernel does: the cost report.

A ``Trace`` is active while a kernel runs on the emulator. Every ISA call records one
instruction on its engine; DMA bytes are the destination's bytes; FLOPs count 2*K*M*N per
nc_matmul and one per output element of every other compute instruction. On-chip footprint
is the peak of the bytes per partition held by live SBUF / PSUM tensors (a tensor is live
from ``nl.ndarray`` until the kernel drops its last reference, i.e. Python's lifetime, an
upper bound on what the compiler's allocator needs); HBM is what the kernel allocates plus
its arguments.
"""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclass
class CostReport:
    instructions: Counter = field(default_factory=Counter)  # by engine
    opcodes: Counter = field(default_factory=Counter)  # by nki.isa name
    dma_bytes: int = 0
    dma_transfers: int = 0
    matmul_flops: int = 0
    other_flops: int = 0
    peak_sbuf_bytes_per_partition: int = 0
    peak_psum_bytes_per_partition: int = 0
    hbm_argument_bytes: int = 0
    hbm_allocated_bytes: int = 0
    programs: int = 1
    numerics: bool = True

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.other_flops

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
    """The state of one emulated kernel launch (all its programs)."""

    def __init__(self, numerics: bool = True, grid: tuple[int, ...] = ()):
        self.report = CostReport(numerics=numerics)
        self.numerics = numerics
        self.grid = grid
        self.program = (0,) * len(grid)
        self._live = {"sbuf": 0, "psum": 0}
        self.shared: list = []  # shared_hbm storages of an SPMD launch, in allocation order
        self.shared_counter = 0  # this program's next shared_hbm allocation

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

    def allocated(self, storage, kind: str, bytes_per_partition: int, total: int) -> None:
        if kind in self._live:
            self._live[kind] += bytes_per_partition
            peak = f"peak_{kind}_bytes_per_partition"
            setattr(self.report, peak, max(getattr(self.report, peak), self._live[kind]))
            weakref.finalize(storage, self._release, kind, bytes_per_partition)
        elif kind == "argument":
            self.report.hbm_argument_bytes += total
        else:
            self.report.hbm_allocated_bytes += total

    def _release(self, kind: str, bytes_per_partition: int) -> None:
        self._live[kind] -= bytes_per_partition


_active: list[Trace] = []


def active() -> Trace:
    if not _active:
        raise RuntimeError("nki emulator: no kernel is running; call the kernel through nki.jit "
                           "(or harness.nki_emu.trace) so it runs on the emulator")
    return _active[-1]


def push(trace: Trace) -> None:
    _active.append(trace)


def pop() -> None:
    _active.pop()

"""The programs of an SPMD launch (LNC=2: two NeuronCores) running together, deterministically.

Each program runs on its own thread, but only one runs at a time: program 0 runs until it
waits at an ``nki.isa.core_barrier`` (or a ``sendrecv``) or ends, then the next program that
can run, and so on; the programs named in a barrier pass it together, in a new epoch. A
barrier that some program never reaches is an error naming both programs. The schedule
decides what a program that reads the other's output without a barrier sees (memory nothing
wrote yet reads as poison); ``races.Writes`` makes the other order fail too: a read of what
another program wrote in the same epoch, or a different value written over it, is a
``RuleViolation`` (rule ``lnc-race``), whatever the schedule.
"""

from __future__ import annotations

import threading

from harness.kernels.emu import cost, races
from harness.kernels.emu.rules import RuleViolation


class _Aborted(BaseException):
    """Unwinds a waiting program when another program failed."""


class Scheduler:
    def __init__(self, programs: list[cost.Program]):
        self.programs = programs
        self.cond = threading.Condition()
        self.running: int | None = None
        self.done: set[int] = set()
        self.waiting: dict[int, tuple] = {}  # program index -> (what, key, payload)
        self.error: BaseException | None = None
        self.results: dict[int, object] = {}
        self.exchanges: dict = {}  # sendrecv payloads waiting for their partner

    # ------------------------------------------------------------------ running
    def run(self, body) -> dict[int, object]:
        threads = [threading.Thread(target=self._main, args=(p, body), daemon=True,
                                    name=f"nki-emu program {p.id}") for p in self.programs]
        for thread in threads:
            thread.start()
        with self.cond:
            self.running = 0
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.error is not None or len(self.done) == len(self.programs))
            if self.error is not None:
                self.running = None
                self.cond.notify_all()
        for thread in threads:
            thread.join()
        if self.error is not None:
            raise self.error
        return self.results

    def _main(self, program: cost.Program, body) -> None:
        cost.set_active(program)
        try:
            with self.cond:
                self._wait_turn(program)
            self.results[program.index] = body(program)
        except _Aborted:
            pass
        except BaseException as error:
            with self.cond:
                if self.error is None:
                    self.error = error
                self.cond.notify_all()
        finally:
            cost.set_active(None)
            with self.cond:
                self.done.add(program.index)
                if self.error is None:
                    self._next()
                self.cond.notify_all()

    def _wait_turn(self, program: cost.Program) -> None:
        self.cond.wait_for(lambda: self.error is not None or self.running == program.index)
        if self.error is not None:
            raise _Aborted()

    def _next(self) -> None:
        """Hand the turn to the lowest program that can run; if every unfinished program waits,
        release the group that has arrived, or fail on the barrier nobody else reaches."""
        for p in self.programs:
            if p.index not in self.done and p.index not in self.waiting:
                self.running = p.index
                return
        if not self.waiting:
            self.running = None
            return
        blocked = min(self.waiting)
        what, key, _ = self.waiting[blocked]
        partners = [i for i in key[1] if i != blocked]
        missing = [i for i in partners if i in self.done]
        self.error = RuleViolation("core-barrier", f"program {self.programs[blocked].id} waits at {what} #{key[0] + 1} "
                                   f"with cores {key[1]}, and program(s) {missing or partners} finished without "
                                   f"reaching it")
        self.running = None

    # ------------------------------------------------------------------ synchronisation
    def _arrive(self, program: cost.Program, what: str, cores, payload=None) -> dict[int, object]:
        """Wait until every program of ``cores`` arrived at this synchronisation point."""
        cores = tuple(sorted({int(c) for c in cores} & {p.index for p in self.programs}))
        if len(cores) < 2 or program.index not in cores:
            return {program.index: payload}
        races.settle(program)
        key = (program.epoch, cores)
        with self.cond:
            self.waiting[program.index] = (what, key, payload)
            group = [i for i, w in self.waiting.items() if w[1] == key]
            if len(group) == len(cores):
                payloads = {i: self.waiting.pop(i)[2] for i in group}
                self.exchanges[key] = payloads
                for i in group:
                    self.programs[i].epoch += 1
                self.running = program.index
                return payloads
            self._next()
            self.cond.notify_all()
            self._wait_turn(program)
            return self.exchanges[key]

    def barrier(self, program: cost.Program, cores) -> None:
        self._arrive(program, "nki.isa.core_barrier", cores)

    def exchange(self, program: cost.Program, peers, payload) -> dict[int, object]:
        return self._arrive(program, "nki.isa.sendrecv", peers, payload)


def run(programs: list[cost.Program], body) -> dict[int, object]:
    """Run ``body(program)`` for every program: inline for one, on the scheduler for more."""
    if len(programs) == 1:
        previous = cost.set_active(programs[0])
        try:
            return {0: body(programs[0])}
        finally:
            cost.set_active(previous)
    scheduler = Scheduler(programs)
    for p in programs:
        p.scheduler = scheduler
    return scheduler.run(body)

"""Running a kernel on the emulator: ``nki.jit`` kernels, SPMD grids (their programs run
together, ``programs.py``), argument and result conversion, the on-chip capacity check of each
program, and the cost report of the launch."""

from __future__ import annotations

import functools
import itertools

import torch

from harness.kernels.emu import cost, programs, tensors
from harness.kernels.emu import races as race_check
from harness.kernels.emu.cost import CostReport
from harness.kernels.emu.rules import RuleViolation


def _to_torch_argument(value):
    if isinstance(value, torch.Tensor):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "dtype") and hasattr(value, "shape"):
        return tensors.numpy_to_torch(value)  # NumPy arrays (ml_dtypes bfloat16 included)
    return None


def _results(value, convert=tensors.to_torch):
    if isinstance(value, tensors.NkiTensor):
        return convert(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_results(v, convert) for v in value)
    if isinstance(value, dict):
        return {k: _results(v, convert) for k, v in value.items()}
    return value


def _body(kernel):
    return kernel.func if isinstance(kernel, JitKernel) else kernel


def check_capacity(program: cost.Program) -> None:
    """trn2's SBUF and PSUM hold what is live at each instruction (rules sbuf-/psum-capacity):
    the live tiles' bytes, over all their partitions, within 128 partitions x the capacity."""
    report = program.report
    for kind, (peak, at, live) in program.live_peaks().items():
        key = f"peak_{kind}_bytes_per_partition"
        setattr(report, key, max(getattr(report, key), -(-peak // tensors.PMAX)))
        capacity = tensors.PMAX * tensors.CAPACITY[kind]
        if peak > capacity:
            tiles = ", ".join(f"{s.name or 'unnamed'}{list(s.shape)} {tensors.dtypes.name_of(s.dtype)}" for s, _ in
                              sorted(live, key=lambda t: -t[1])[:8])
            where = f" of program {program.id}" if program.grid else ""
            raise RuleViolation(f"{kind}-capacity", f"at instruction {at}{where} the live {kind.upper()} tiles hold "
                                f"{peak} B > {capacity} B ({tensors.PMAX} partitions x {tensors.CAPACITY[kind]} B; "
                                f"{len(live)} tiles, largest first: {tiles})")


def launch(kernel, args, kwargs, grid=(), numerics: bool = True, convert=tensors.to_torch,
           races: str = "raise") -> tuple[object, CostReport]:
    """Run ``kernel`` (an emulator ``nki.jit`` kernel or its body) on torch arguments: tensors
    are copied into HBM (shared by every program), everything else is passed as is. Returns
    (results as torch tensors, the launch's cost report); with several programs, the results
    of the last program that returned any (``convert``: tensors.to_numpy for NumPy results).
    ``numerics=False``: tensors may be meta tensors, nothing is computed, results are meta
    tensors, the report is complete. ``races="record"``: a race between programs (races.py) is
    recorded in the report's ``races`` instead of raising, and the launch runs on."""
    func = _body(kernel)
    grid = tuple(grid)
    trace = cost.Trace(numerics=numerics, grid=grid, races=races)
    ids = list(itertools.product(*(range(g) for g in grid))) if grid else [()]
    launch_programs = [cost.Program(trace, i) for i in ids]
    for index, program in enumerate(launch_programs):
        program.index = index
    trace.program_ids = ids
    trace.concurrent = len(ids) > 1
    trace.report.programs = len(ids)
    previous = cost.set_active(launch_programs[0])
    try:
        hbm_args = [_argument(a, f"arg{i}") for i, a in enumerate(args)]
        hbm_kwargs = {k: _argument(v, k) for k, v in kwargs.items()}
    finally:
        cost.set_active(previous)

    def body(program):
        result = func(*hbm_args, **hbm_kwargs)
        race_check.settle(program)
        check_capacity(program)
        return result

    results = programs.run(launch_programs, body)
    returned = [results[i] for i in sorted(results) if results[i] is not None]
    previous = cost.set_active(launch_programs[0])
    try:
        return _results(returned[-1] if returned else None, convert), trace.report
    finally:
        cost.set_active(previous)


def _argument(value, name):
    tensor = _to_torch_argument(value)
    if tensor is None:
        return value
    dtype = getattr(value, "dtype", None) if type(value).__module__ == "numpy" else None
    return tensors.from_torch(tensor, name, dtype)


class JitKernel:
    """What ``nki.jit`` returns on the emulator: call it (inside or outside a running kernel),
    or launch an SPMD grid with ``kernel[grid](...)``."""

    def __init__(self, func, grid=(), **options):
        functools.update_wrapper(self, func)
        self.func, self.grid, self.options = func, tuple(grid), options

    def __getitem__(self, grid) -> JitKernel:
        grid = grid if isinstance(grid, tuple) else (grid,)
        return JitKernel(self.func, grid, **self.options)

    def __call__(self, *args, **kwargs):
        if cost.running():  # a kernel calling a kernel: trace its body inline
            return self.func(*args, **kwargs)
        return launch(self, args, kwargs, self.grid)[0]

    def __repr__(self) -> str:
        return f"<nki emulator jit kernel {self.func.__qualname__}>"


def jit(func=None, **options):
    if func is None:
        return lambda f: JitKernel(f, **options)
    return JitKernel(func, **options)

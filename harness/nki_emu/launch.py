"""Running a kernel on the emulator: ``nki.jit`` kernels, SPMD grids, argument and result
conversion, and the cost report of the launch."""

from __future__ import annotations

import functools
import itertools

import torch

from harness.nki_emu import cost, tensors
from harness.nki_emu.cost import CostReport


def _to_torch_argument(value):
    if isinstance(value, torch.Tensor):
        return value
    if type(value).__module__ == "numpy":  # NumPy arrays (ml_dtypes bfloat16 included)
        from harness.ops.nki.simulation import numpy_to_torch

        return numpy_to_torch(value)
    return None


def _results(value):
    if isinstance(value, tensors.NkiTensor):
        return tensors.to_torch(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_results(v) for v in value)
    if isinstance(value, dict):
        return {k: _results(v) for k, v in value.items()}
    return value


def _body(kernel):
    return kernel.func if isinstance(kernel, JitKernel) else kernel


def launch(kernel, args, kwargs, grid=(), numerics: bool = True) -> tuple[object, CostReport]:
    """Run ``kernel`` (an emulator ``nki.jit`` kernel or its body) on torch arguments: tensors
    are copied into HBM, everything else is passed as is. Returns (results as torch tensors,
    the launch's cost report). ``numerics=False``: tensors may be meta tensors, nothing is
    computed, results are meta tensors, the report is complete."""
    func = _body(kernel)
    trace = cost.Trace(numerics=numerics, grid=tuple(grid))
    cost.push(trace)
    try:
        def convert(value, name):
            tensor = _to_torch_argument(value)
            return tensors.from_torch(tensor, name) if tensor is not None else value

        hbm_args = [convert(a, f"arg{i}") for i, a in enumerate(args)]
        hbm_kwargs = {k: convert(v, k) for k, v in kwargs.items()}
        programs = list(itertools.product(*(range(g) for g in grid))) if grid else [()]
        trace.report.programs = len(programs)
        result = None
        for program in programs:
            trace.program, trace.shared_counter = program, 0
            result = func(*hbm_args, **hbm_kwargs)
        return _results(result), trace.report
    finally:
        cost.pop()


class JitKernel:
    """What ``nki.jit`` returns on the emulator: call it (inside or outside a running kernel),
    or launch an SPMD grid with ``kernel[grid](...)``."""

    def __init__(self, func, grid=(), **options):
        functools.update_wrapper(self, func)
        self.func, self.grid, self.options = func, tuple(grid), options

    def __getitem__(self, grid) -> "JitKernel":
        grid = grid if isinstance(grid, tuple) else (grid,)
        return JitKernel(self.func, grid, **self.options)

    def __call__(self, *args, **kwargs):
        if cost._active:  # a kernel calling a kernel: trace its body inline
            return self.func(*args, **kwargs)
        return launch(self, args, kwargs, self.grid)[0]

    def __repr__(self) -> str:
        return f"<nki emulator jit kernel {self.func.__qualname__}>"


def jit(func=None, **options):
    if func is None:
        return lambda f: JitKernel(f, **options)
    return JitKernel(func, **options)

"""The top-level ``nki`` module of the emulator (installed as ``sys.modules["nki"]``), with the
smaller modules of the ``nki`` tree (``nki.typing``, ``nki.compiler``, ``nki.tensor``,
``nki.builtin``, ``nki.isa.constants``, ``nki.language.dtypes``) as its attributes.

``cpu_simulate(kernel)[lnc](**numpy_inputs)`` is nki-library's simulator entry point (its
``test/utils/simulation_setup.py`` calls it): the kernel runs on the emulator with ``lnc``
programs and its results come back as NumPy arrays in their NKI dtypes. The Neuron SDK's own
simulator API (``nki.simulate``) is not faked: an unknown name is an ``AttributeError``.
"""

from __future__ import annotations

import types

import numpy as np

from harness.kernels.emu import dtypes, isa, isa_constants, language
from harness.kernels.emu.launch import JitKernel, jit, launch  # noqa: F401
from harness.kernels.emu.rules import RuleViolation
from harness.kernels.emu.tensors import NkiTensor, to_numpy

__emulator__ = True
__version__ = "0.7.0+nki-emu (harness NKI emulator, not the Neuron SDK)"
EMULATOR_NAME = "nki-emu"
dtype = np.dtype  # nki.dtype: the type of every NKI dtype (used in kernel annotations)


def _module(name: str, doc: str, **names) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    module.__dict__.update(names, __emulator__=True)

    def missing(attribute: str):
        raise AttributeError(f"nki emulator: module {name} has no attribute {attribute!r}")

    module.__getattr__ = missing
    return module


typing = _module("nki.typing", "Kernel argument annotations.", tensor=NkiTensor, mutable_tensor=NkiTensor,
                 scalar=object)
tensor = _module("nki.tensor", "The NKI tensor type.", NkiTensor=NkiTensor)
compiler = _module("nki.compiler", "The Neuron compiler's entry points: none on the emulator (it compiles nothing).")
builtin = _module("nki.builtin", "NKI builtins: none beyond nki.language and nki.isa on the emulator.")
isa.constants = isa_constants
language.dtypes = dtypes


class _Simulation:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, lnc):
        lnc = int(lnc[0] if isinstance(lnc, tuple) else lnc)
        if lnc not in (1, 2):
            raise ValueError(f"nki emulator: cpu_simulate(kernel)[{lnc}]: trn2's logical NeuronCore has 1 or 2 cores")
        grid = (lnc,) if lnc > 1 else ()
        return lambda *args, **kwargs: launch(self.kernel, args, kwargs, grid, convert=to_numpy)[0]

    def __call__(self, *args, **kwargs):
        return self[1](*args, **kwargs)


def cpu_simulate(kernel) -> _Simulation:
    """``cpu_simulate(kernel)[lnc](**inputs)``: run on the emulator with ``lnc`` programs
    (LNC=2: two programs, ``programs.py``), NumPy in, NumPy out."""
    return _Simulation(kernel)


def __getattr__(name: str):
    raise AttributeError(f"nki emulator: module nki has no attribute {name!r} (not an NKI 0.7 name the emulator "
                         f"implements; the Neuron SDK's nki.simulate is not faked)")


__all__ = ["isa", "language", "jit", "dtype", "RuleViolation", "cpu_simulate", "typing", "tensor", "compiler",
           "builtin"]

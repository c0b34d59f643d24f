"""Data model of the kernel registry: operators, cases, implementations, devices."""

from __future__ import annotations

import functools
import importlib.util
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.device.devices import device_status  # noqa: F401  (the one device probe, re-exported)
from harness.device.package_probe import probe_module

DTYPES = (torch.float32, torch.bfloat16)
DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

# Devices an implementation can run on. "nki-emu" is the harness's NKI emulator (harness/kernels/emu,
# CPU, always available); "nki-sim" is the Neuron SDK's NKI CPU simulator (nki.simulate).
DEVICES = ("cpu", "cuda", "nki-emu", "nki-sim", "neuron")
DEVICE_MARKERS = {"cuda": "cuda", "neuron": "neuron"}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES[dtype]


def always() -> tuple[bool, str]:
    return True, "available"


def module_probe(name: str) -> Callable[[], tuple[bool, str]]:
    """A probe for an importable module, treating the PyPI Neuron placeholders as absent."""

    @functools.cache
    def probe() -> tuple[bool, str]:
        if importlib.util.find_spec(name.split(".")[0]) is None:
            return False, f"{name} is not installed"
        return probe_module(name)

    probe.__name__ = f"probe_{name}"
    return probe


def torch_device(device: str) -> torch.device:
    """The torch device tensors live on for a registry device ("nki-emu"/"nki-sim" run on CPU tensors)."""
    return torch.device({"cpu": "cpu", "nki-emu": "cpu", "nki-sim": "cpu", "cuda": "cuda", "neuron": "neuron"}[device])


@dataclass(eq=False)
class Case:
    """One input configuration of an operator.

    ``build(generator)`` returns the *master* inputs: floating tensors in float64 (the exact
    values the float64 truth is computed from; the implementation under test receives them
    rounded to the test dtype) and integer tensors as they are.
    """

    name: str
    build: Callable[[torch.Generator], dict[str, torch.Tensor]]
    params: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    dtypes: tuple[torch.dtype, ...] = DTYPES

    def seed(self, op_name: str) -> int:
        return zlib.crc32(f"{op_name}/{self.name}".encode())


@dataclass(eq=False)
class Implementation:
    """An implementation under test of one operator.

    ``run(inputs, params, device)`` gets the op's named inputs (already on the device, floats
    in the test dtype, ``requires_grad`` set on differentiable ones) and returns the op's named
    outputs. ``compute_dtype(dtype, device)`` declares the precision it computes in for a given
    input dtype: the tolerance is chosen for the lower of that and each output's own dtype.
    ``output_dtypes(dtype, device)`` is the dtype contract the implementation documents for its
    outputs (checked), or None.
    """

    name: str
    library: str
    target: str
    devices: tuple[str, ...]
    run: Callable[[dict, dict, str], dict[str, torch.Tensor]]
    compute_dtype: Callable[[torch.dtype, str], torch.dtype] = lambda dtype, device: dtype
    backward: bool = True
    requires: Callable[[], tuple[bool, str]] = always
    output_dtypes: Callable[[torch.dtype, str], dict[str, torch.dtype]] | None = None
    notes: str = ""
    device_requires: dict[str, Callable[[], tuple[bool, str]]] = field(default_factory=dict)
    # On these devices only these cases (CPU time), the reason in ``notes``.
    device_cases: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def runs_case(self, device: str, case_name: str) -> bool:
        return case_name in self.device_cases.get(device, (case_name,))

    def requirement(self, device: str) -> Callable[[], tuple[bool, str]]:
        """What must be installed to run on ``device`` (``device_requires`` overrides ``requires``)."""
        return self.device_requires.get(device, self.requires)


@dataclass(eq=False)
class OpSpec:
    """An operator: its reference, cases and implementations.

    ``pin(outputs)`` maps an implementation's outputs to extra reference keyword arguments
    (the router pins the expert ids the implementation chose, so ties resolve the same way).
    ``cotangents(outputs, inputs, generator)`` builds float64 upstream gradients for the
    differentiable outputs (default: standard normal of each output's shape).
    ``kernels`` lists the harness's own kernels of this op as ``(module, function)``; each must
    have its torch twin ``(module + "_torch", function + "_torch_ref")`` with the same
    signature (``registry.twin_problems``).
    """

    name: str
    title: str
    op_class: str
    reference: Callable[..., dict[str, torch.Tensor]]
    float_inputs: tuple[str, ...]
    diff_inputs: tuple[str, ...]
    diff_outputs: tuple[str, ...]
    cases: tuple[Case, ...]
    implementations: tuple[Implementation, ...] = ()
    pin: Callable[[dict], dict] | None = None
    cotangents: Callable[[dict, dict, torch.Generator], dict[str, torch.Tensor]] | None = None
    discrete_outputs: tuple[str, ...] = ()
    ignore_outputs: tuple[str, ...] = ()
    gradcheck_case: Case | None = None
    kernels: tuple[tuple[str, str], ...] = ()

    def case(self, name: str) -> Case:
        for case in self.cases:
            if case.name == name:
                return case
        raise KeyError(f"op {self.name!r} has no case {name!r}")

    def implementation(self, name: str) -> Implementation:
        for impl in self.implementations:
            if impl.name == name:
                return impl
        raise KeyError(f"op {self.name!r} has no implementation {name!r}")

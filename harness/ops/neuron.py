"""Neuron detection and the Neuron (NKI) registration of the harness operators.

NOT YET RUN ON HARDWARE. Everything here is import-guarded: without the real Neuron SDK
nothing is registered and importing ``harness.ops`` still works.

PyPI's ``nki``, ``torch-neuronx`` and ``neuronx-cc`` are placeholders whose import raises
``ImportError("WRONG PACKAGE ...")``; ``probe_module`` reports them as absent with that
reason. The real packages come from the Neuron image.

Registration: ``torch.library.register_kernel(op, "neuron", fn)`` adds a kernel for the
``neuron`` device (torch-neuronx's PrivateUse1 backend) to each harness op; ``fn`` lays the
tensors out for the NKI kernel and calls it on Neuron tensors, which torch-neuronx compiles
and runs (eager: compiled per shape on first call). The autograd formulas registered in
``rope.py``/``grouped_swiglu.py`` are device-independent torch code, so backward on Neuron
runs as ordinary torch-neuronx ops.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

from harness.package_probe import PLACEHOLDER_MARKER, is_emulator, nki_available, probe_module  # noqa: F401

# Filled by register_neuron_kernels(): {"registered": bool, "reason": str, "ops": [...]}.
NEURON_REGISTRATION: dict = {"registered": False, "reason": "register_neuron_kernels() not called", "ops": []}


@functools.lru_cache(maxsize=None)
def neuron_available() -> tuple[bool, str]:
    """(available, reason) for running the NKI kernels: the 'neuron' device is present
    (``harness.devices.neuron_status``, the one device probe) and the real ``nki`` imports."""
    from harness.devices import neuron_status

    ok, reason = probe_module("nki")
    if not ok:
        return False, reason
    return neuron_status()


def numpy_to_torch(array):
    """A NumPy array as a torch tensor, bfloat16 included: ``nki.simulate`` returns bfloat16 as
    ``ml_dtypes.bfloat16`` arrays, which ``torch.as_tensor`` rejects; their bits are reread
    as torch bfloat16."""
    import numpy as np
    import torch

    array = np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())


def as_torch(value):
    """A kernel result (torch tensor, NumPy array, or a tuple of them) as torch tensors."""
    import torch

    if isinstance(value, (tuple, list)):
        return type(value)(as_torch(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value
    return numpy_to_torch(value)


# The real simulator without a chip targets trn3 (the NKI simulator guide), whose looser limits
# (nc_matmul moving free size 4096, bf16 PSUM results) would let trn2 violations through.
SIMULATOR_ENV = {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"}


def simulated(kernel):
    """``nki.simulate(kernel)`` pinned to trn2, with results as torch tensors (``as_torch``)."""
    import os

    import nki

    def call(*args, **kwargs):
        for name, value in SIMULATOR_ENV.items():
            if os.environ.get(name, value) != value:
                raise RuntimeError(f"{name}={os.environ[name]!r}: the harness simulates trn2 only; unset it or set {value!r}")
            os.environ[name] = value
        return as_torch(nki.simulate(kernel)(*args, **kwargs))

    return call


NKILIB_PACKAGES = ("nkilib", "nkilib_src.nkilib")  # neuronx-cc's bundled copy, then the standalone wheel


def nkilib_module(path: str, import_module=None):
    """nki-library's module ``path`` (e.g. ``"core.embeddings.rope"``): the copy bundled with
    neuronx-cc is ``nkilib``, the standalone wheel's package is ``nkilib_src.nkilib``."""
    import_module = import_module or importlib.import_module
    missed = []
    for package in NKILIB_PACKAGES:
        try:
            return import_module(f"{package}.{path}")
        except ImportError as error:
            missed.append(f"{package}.{path}: {type(error).__name__}: {error}")
    raise ImportError("nki-library module not found; tried " + "; ".join(missed))


def clear_caches() -> None:
    nki_available.cache_clear()
    neuron_available.cache_clear()


def register_neuron_kernels() -> dict:
    """Register the NKI kernels as the 'neuron' implementation of the harness ops, if possible."""
    if NEURON_REGISTRATION["registered"]:
        return NEURON_REGISTRATION
    ok, reason = neuron_available()
    if not ok:
        NEURON_REGISTRATION.update(registered=False, reason=f"not registered: {reason}", ops=[])
        return NEURON_REGISTRATION
    import torch

    from harness.ops.nki import grouped_swiglu_kernel, rope_kernel

    torch.library.register_kernel("harness::rope", "neuron", rope_kernel.rope_neuron)
    torch.library.register_kernel("harness::grouped_swiglu", "neuron", grouped_swiglu_kernel.grouped_swiglu_neuron)
    NEURON_REGISTRATION.update(
        registered=True,
        reason=f"registered ({reason}); not yet validated on hardware by this repo",
        ops=["harness::rope", "harness::grouped_swiglu"],
    )
    return NEURON_REGISTRATION

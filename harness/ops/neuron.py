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

PLACEHOLDER_MARKER = "WRONG PACKAGE"

# Filled by register_neuron_kernels(): {"registered": bool, "reason": str, "ops": [...]}.
NEURON_REGISTRATION: dict = {"registered": False, "reason": "register_neuron_kernels() not called", "ops": []}


def probe_module(name: str) -> tuple[bool, str]:
    """(importable, reason) for a module, treating the PyPI placeholder as absent."""
    try:
        if importlib.util.find_spec(name) is None:
            return False, f"{name} is not installed"
    except (ImportError, ValueError) as error:
        return False, f"{name}: {type(error).__name__}: {error}"
    try:
        importlib.import_module(name)
    except ImportError as error:
        if PLACEHOLDER_MARKER in str(error):
            return False, f"{name} is the PyPI placeholder package (import raises 'WRONG PACKAGE'), not the Neuron SDK's"
        return False, f"{name} failed to import: {type(error).__name__}: {error}"
    except Exception as error:  # a broken install must not break harness.ops
        return False, f"{name} failed to import: {type(error).__name__}: {error}"
    return True, f"{name} imports"


def is_emulator(module) -> bool:
    """The harness's own NKI emulator (``harness.nki_emu``), which is never the real ``nki``."""
    return getattr(module, "__emulator__", False) is True


@functools.lru_cache(maxsize=None)
def nki_available() -> tuple[bool, str]:
    """(available, reason) for the real ``nki`` package with ``nki.simulate`` (CPU simulator).
    The harness's emulator (``harness.nki_emu``, device tier ``nki-emu``) is not it."""
    ok, reason = probe_module("nki")
    if not ok:
        return False, reason
    nki = importlib.import_module("nki")
    if is_emulator(nki):
        return False, "nki is the harness's NKI emulator (nki-emu), not the Neuron SDK's nki"
    if "simulate" not in dir(nki) or "jit" not in dir(nki):
        return False, "nki imports but has no nki.jit/nki.simulate (need NKI 0.7 or later)"
    return True, f"nki {getattr(nki, '__version__', '?')} with nki.simulate"


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

"""Is a package really importable? The one probe for packages PyPI serves as placeholders.

PyPI's ``nki``, ``torch-neuronx`` and ``neuronx-cc`` are placeholders whose import raises
``ImportError("WRONG PACKAGE ...")``; ``probe_module`` reports them as absent with that
reason. It sits below both ``harness.device.devices`` (the device probe) and ``harness.kernels.ops.neuron``
(the Neuron registration), so neither imports the other to ask.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys

PLACEHOLDER_MARKER = "WRONG PACKAGE"


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
            return False, (f"{name} is the PyPI placeholder package (import raises 'WRONG PACKAGE'), "
                           "not the Neuron SDK's")
        return False, f"{name} failed to import: {type(error).__name__}: {error}"
    except Exception as error:  # a broken install must not break harness.kernels.ops
        return False, f"{name} failed to import: {type(error).__name__}: {error}"
    return True, f"{name} imports"


def is_emulator(module) -> bool:
    """The harness's own NKI emulator (``harness.kernels.emu``), which is never the real ``nki``."""
    return getattr(module, "__emulator__", False) is True


def nki_available() -> tuple[bool, str]:
    """(available, reason) for the real ``nki`` package with ``nki.simulate`` (CPU simulator).
    The harness's emulator (``harness.kernels.emu``, device tier ``nki-emu``) is not it, even while
    it is installed as ``sys.modules["nki"]`` (that answer is not cached)."""
    if is_emulator(sys.modules.get("nki")):
        return False, "nki is the harness's NKI emulator (nki-emu), not the Neuron SDK's nki"
    return _real_nki_available()


@functools.cache
def _real_nki_available() -> tuple[bool, str]:
    ok, reason = probe_module("nki")
    if not ok:
        return False, reason
    nki = importlib.import_module("nki")
    if is_emulator(nki):
        return False, "nki is the harness's NKI emulator (nki-emu), not the Neuron SDK's nki"
    if "simulate" not in dir(nki) or "jit" not in dir(nki):
        return False, "nki imports but has no nki.jit/nki.simulate (need NKI 0.7 or later)"
    return True, f"nki {getattr(nki, '__version__', '?')} with nki.simulate"


nki_available.cache_clear = _real_nki_available.cache_clear

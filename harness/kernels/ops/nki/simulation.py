"""Calling NKI kernels off the device: the real ``nki.simulate`` pinned to trn2, kernel results
as torch tensors (bfloat16 ``ml_dtypes`` arrays included), and nki-library's package path.

Below the kernels (``harness/kernels/ops/nki/*_kernel.py`` import it) and below the Neuron registration
(``harness.kernels.ops.neuron`` re-exports it), so imports flow one way.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import torch


def numpy_to_torch(array):
    """A NumPy array as a torch tensor, bfloat16 included: ``nki.simulate`` returns bfloat16 as
    ``ml_dtypes.bfloat16`` arrays, which ``torch.as_tensor`` rejects; their bits are reread
    as torch bfloat16."""
    array = np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())


def as_torch(value):
    """A kernel result (torch tensor, NumPy array, or a tuple of them) as torch tensors."""
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
    import nki  # noqa: PLC0415  optional: the real nki (Neuron SDK) may be absent

    def call(*args, **kwargs):
        unset = [name for name in SIMULATOR_ENV if name not in os.environ]
        for name, value in SIMULATOR_ENV.items():
            if os.environ.get(name, value) != value:
                raise RuntimeError(f"{name}={os.environ[name]!r}: the harness simulates trn2 only; "
                                   f"unset it or set {value!r}")
            os.environ[name] = value
        try:
            return as_torch(nki.simulate(kernel)(*args, **kwargs))
        finally:  # the process's environment is every later launch's: leave it as it was
            for name in unset:
                os.environ.pop(name, None)

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

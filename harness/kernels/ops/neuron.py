"""Neuron detection and the Neuron (NKI) registration of the harness operators.

NOT YET RUN ON HARDWARE. Everything here is import-guarded: without the real Neuron SDK
nothing is registered and importing ``harness.kernels.ops`` still works.

PyPI's ``nki``, ``torch-neuronx`` and ``neuronx-cc`` are placeholders whose import raises
``ImportError("WRONG PACKAGE ...")``; ``probe_module`` reports them as absent with that
reason. The real packages come from the Neuron image.

Registration: ``torch.library.register_kernel(op, "neuron", fn)`` adds a kernel for the
``neuron`` device (torch-neuronx's PrivateUse1 backend) to each harness op; ``fn`` lays the
tensors out for the NKI kernel and calls it on Neuron tensors, which torch-neuronx compiles
and runs (eager: compiled per shape on first call). The MoE kernels launch on two programs
(LNC=2, trn2's default). Backward: ``harness::grouped_swiglu``'s autograd formula calls the op
``harness::grouped_swiglu_backward``, whose neuron kernel is NKI (our forward's recompute, then
nki-library's blockwise backward: harness/kernels/ops/nki/grouped_swiglu_backward.py); RoPE's autograd
formula (``rope.py``) is device-independent torch code and runs as torch-neuronx ops.
"""

from __future__ import annotations

import functools

import torch

from harness.device.devices import neuron_status
from harness.device.package_probe import PLACEHOLDER_MARKER, is_emulator, nki_available, probe_module  # noqa: F401

# Filled by register_neuron_kernels(): {"registered": bool, "reason": str, "ops": [...]}.
NEURON_REGISTRATION: dict = {"registered": False, "reason": "register_neuron_kernels() not called", "ops": []}


@functools.cache
def neuron_available() -> tuple[bool, str]:
    """(available, reason) for running the NKI kernels: the 'neuron' device is present
    (``harness.device.devices.neuron_status``, the one device probe) and the real ``nki`` imports."""
    ok, reason = probe_module("nki")
    if not ok:
        return False, reason
    return neuron_status()


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

    from harness.kernels.ops.nki import grouped_swiglu_backward, grouped_swiglu_kernel, rope_kernel  # noqa: PLC0415  optional: the kernels import nki where installed; registered on a Neuron device only

    kernels = {
        "harness::rope": rope_kernel.rope_neuron,
        "harness::grouped_swiglu": grouped_swiglu_kernel.grouped_swiglu_neuron,
        "harness::grouped_swiglu_backward": grouped_swiglu_backward.grouped_swiglu_backward_neuron,
    }
    for op, kernel in kernels.items():
        torch.library.register_kernel(op, "neuron", kernel)
    NEURON_REGISTRATION.update(
        registered=True,
        reason=f"registered ({reason}); not yet validated on hardware by this repo",
        ops=list(kernels),
    )
    return NEURON_REGISTRATION

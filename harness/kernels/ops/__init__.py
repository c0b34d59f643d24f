"""Custom operators for the ``nki_moe`` backend: RoPE and the grouped expert SwiGLU MLP.

Three operators are registered with ``torch.library`` in the ``harness`` namespace:

``torch.ops.harness.rope(x, cos, sin) -> y``
    rotate-half RoPE with exactly ``CosSinRoPE.apply_rotary_emb`` semantics (see ``rope.py``).
``torch.ops.harness.grouped_swiglu(x_RD, offsets_E, w1_EFD, w2_EDF, w3_EFD) -> y_RD``
    ``GroupedExperts.forward``'s computation with torchtitan's dtype policy (see
    ``grouped_swiglu.py``).
``torch.ops.harness.grouped_swiglu_backward(grad, x_RD, offsets_E, w1, w2, w3) -> (dx, dw1, dw2, dw3)``
    its backward, which its autograd formula calls: torch kernels on CPU/CUDA, NKI on neuron.

Every kernel module ``X.py`` here (and in ``nki/``) has its float64-capable torch reference
``X_torch.py`` beside it: for each kernel function ``f`` in ``X.py``, ``X_torch.f_torch_ref``
takes the same arguments (nki-library's convention). The kernel registry checks the pairing
(``harness.kernels.checks.registry.twin_problems``). ``rope_torch`` is the repository's one
RoPE reference (inverse frequencies, cos/sin, the rotation).

Each has a CPU/CUDA kernel written in torch, a fake (meta) kernel and autograd, so
registration, autograd and the module swap run on every device. On a Neuron device the
implementation is an NKI kernel (``harness/kernels/ops/nki/``; the MoE backward is nki-library's,
fed by our forward's recompute), registered by ``neuron.py`` only when the real
``torch_neuronx`` and ``nki`` import (the PyPI placeholders count as absent).

Importing this package never imports torchtitan or a Neuron package. The torchtitan-facing
pieces (``CustomOpCosSinRoPE``, ``CustomOpGroupedExperts``, ``use_custom_ops``) load on first
attribute access.
"""

from __future__ import annotations

import importlib

from harness.kernels.ops import grouped_swiglu, rope
from harness.kernels.ops.neuron import NEURON_REGISTRATION, neuron_available, register_neuron_kernels

register_neuron_kernels()

_LAZY = {
    "CustomOpCosSinRoPE": "harness.kernels.ops.modules",
    "CustomOpGroupedExperts": "harness.kernels.ops.modules",
    "use_custom_ops": "harness.kernels.ops.modules",
}

__all__ = [
    "NEURON_REGISTRATION",
    "CustomOpCosSinRoPE",
    "CustomOpGroupedExperts",
    "grouped_swiglu",
    "neuron_available",
    "register_neuron_kernels",
    "rope",
    "use_custom_ops",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'harness.kernels.ops' has no attribute {name!r}")

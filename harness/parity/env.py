"""In-process setup for parity checks: the CPU flex-attention shims, applied once.

The parity checks build models in the pytest process (no torchrun). torchtitan 0.3.0 always
routes attention through a ``torch.compile``-wrapped flex attention that refuses backward on
CPU, so the same shims the launcher installs in each rank (``harness/upstream``) are applied
here: flex attention runs eagerly and CPU autograd is allowed, and block masks are built
uncompiled. They change no math (the eager flex HOP computes the same masked softmax attention
densely; the eager create_block_mask returns the same block indices).
"""

from __future__ import annotations

import os

from harness.device.devices import HF_ENV
from harness.upstream import flex_attention_cpu as shim

_DONE = False


def prepare_in_process() -> None:
    """Idempotent: offline Hub, eager CPU flex attention (and block masks) for torchtitan and
    transformers."""
    global _DONE
    if _DONE:
        return
    for name, value in HF_ENV.items():
        os.environ.setdefault(name, value)

    import torch.nn.attention.flex_attention as flex_module  # noqa: PLC0415  heavy: torch; the module imports light, shims applied on call

    if not hasattr(flex_module._validate_device, "__wrapped__"):
        shim.allow_cpu_backward(flex_module)

    import torchtitan.models.common.attention as titan_attention  # noqa: PLC0415  heavy: torchtitan; the module imports light, shims applied on call

    shim.run_flex_eagerly(titan_attention)
    shim.build_block_masks_eagerly_on_cpu(titan_attention)

    import transformers.integrations.flex_attention as hf_flex  # noqa: PLC0415  order: after HF_ENV is set (transformers reads it on import)

    if not hasattr(hf_flex.compile_friendly_flex_attention, "__wrapped__"):
        shim.transformers_flex_eager_on_cpu(hf_flex)
    _DONE = True

"""In-process versions of the opt-in workarounds named in harness/parity/defects.py.

Applied only when a test asks for them (never by default). The torchrun equivalents are the
``hf_rope_init`` upstream shim (harness/upstream/hf_rope_init.py) and the torchtitan override
``harness.parity.titan_overrides.hf_block_causal_mask``.
"""

from __future__ import annotations

import dataclasses

import torch

from harness.parity.spec import Qwen3Arch


def hf_backend_configure(workarounds) -> "callable | None":
    """``configure`` hook for :func:`harness.parity.models.build_hf_backend`."""
    if "hf_block_causal" not in set(workarounds):
        return None

    def configure(config) -> None:
        from harness.parity.titan_overrides import hf_block_causal_mask

        hf_block_causal_mask(config)

    return configure


def hf_backend_after_init(parity_model, workarounds) -> int:
    """``hf_rope_init``: recompute RoPE ``inv_freq`` in an already built backend model."""
    if "hf_rope_init" not in set(workarounds):
        return 0
    from harness.upstream.hf_rope_init import _recompute_inv_freq

    with torch.no_grad():
        return _recompute_inv_freq(parity_model.module.model)


def theta_from_hf(model_config, hf: dict):
    """``titan_4b_theta``: a copy of a Qwen3Model.Config whose every RoPE uses config.json's theta."""
    import copy

    theta = Qwen3Arch.from_hf_dict(hf).rope_theta
    new = copy.deepcopy(model_config)
    for layer in new.layers:
        layer.attention.rope = dataclasses.replace(layer.attention.rope, theta=theta)
    return new


def runspec_fields(backend: str, workarounds, known_shims) -> dict:
    """RunSpec keyword arguments for a torchrun run of ``backend`` with the requested
    workarounds: upstream shims by name, the block-causal override for ``hf_v5`` only."""
    workarounds = set(workarounds)
    fields = {"workarounds": tuple(w for w in sorted(workarounds) if w in known_shims)}
    if backend == "hf_v5" and "hf_block_causal" in workarounds:
        fields["overrides"] = ("--override.imports", "harness.parity.titan_overrides.hf_block_causal_mask")
    return fields

"""The registry's workarounds (harness/registry/known_issues ``WORKAROUNDS``), realised in-process: the one
home of their in-process bodies.

Which workarounds exist, and how each is realised, is data in the registry: ``in_process``
names the function applied in this process; ``rank_shim`` / ``rank_overrides`` are what a
torchrun launch adds (harness/launch/run.py applies those from ``RunSpec.workarounds``). This
module applies the in-process data; the functions whose body lives here are the ones named
``harness.upstream.workarounds:...`` in the registry. Nothing is applied unless asked (the root
``--workaround`` option, fixture ``workarounds``), except where a test names the workaround it
applies to isolate one issue from another.

What each ``in_process`` function is applied to:

- ``hf_rope_init`` -> a built torchtitan transformers-backend model (``HFTransformerModel``);
- ``hf_block_causal`` -> its ``HFTransformerModel.Config``, before the build;
- ``titan_4b_theta`` -> a native ``Qwen3Model.Config`` and the checkpoint's config.json dict.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections.abc import Callable, Iterable

import torch

from harness.registry import known_issues
from harness.registry.hf_config import rope_theta
from harness.upstream.hf_rope_init import _recompute_inv_freq


def in_process(name: str) -> Callable:
    """The registry's in-process function for workaround ``name`` (imported from its
    ``module:function``); an unknown name, or one without an in-process form, is an error."""
    w = known_issues.workaround(name)
    if not w.in_process:
        raise ValueError(f"workaround {name!r} has no in-process form in harness/registry/known_issues/")
    module, _, function = w.in_process.partition(":")
    return getattr(importlib.import_module(module), function)


def apply(name: str, workarounds: Iterable[str], *args):
    """``in_process(name)(*args)`` if ``name`` is among ``workarounds``; else None."""
    if name not in set(workarounds):
        return None
    return in_process(name)(*args)


def hf_backend_configure(workarounds) -> Callable | None:
    """``configure`` hook for :func:`harness.parity.models.build_hf_backend`: the
    config-level workarounds among ``workarounds`` (``hf_block_causal``)."""
    if "hf_block_causal" not in set(workarounds):
        return None
    return lambda config: apply("hf_block_causal", workarounds, config)


def hf_backend_after_init(parity_model, workarounds) -> int:
    """The model-level workarounds among ``workarounds`` (``hf_rope_init``), applied to an
    already built transformers-backend model; returns how many modules were changed."""
    return apply("hf_rope_init", workarounds, parity_model.module) or 0


# ------------------------------------------------------------------ in-process bodies

def hf_rope_init(hf_transformer_model) -> int:
    """``hf_rope_init``: recompute every rotary ``inv_freq`` of a built ``HFTransformerModel``
    (the same code the rank shim runs after ``init_states``)."""
    with torch.no_grad():
        return _recompute_inv_freq(hf_transformer_model.model)


def theta_from_hf(model_config, hf: dict):
    """``titan_4b_theta``: a copy of a Qwen3Model.Config whose every RoPE uses config.json's theta."""
    theta = rope_theta(hf)
    new = copy.deepcopy(model_config)
    for layer in new.layers:
        layer.attention.rope = dataclasses.replace(layer.attention.rope, theta=theta)
    return new

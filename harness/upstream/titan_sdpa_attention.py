"""torchtitan 0.3.0: restore spring-2026 ``attn_backend="sdpa"`` for native language models.

Why: the source's configurations (written against torchtitan ``main`` of spring 2026, which
TorchTitan Neuron 0.2.2+neuron.1 forks) build native Qwen3 with
``model_registry(flavor, attn_backend="sdpa")``. torchtitan 0.3.0 carries #3571 ("deprecate
SDPA and causal mask_type for language models"): ``get_attention_config("sdpa")`` raises
"sdpa is no longer supported for language models", though its ``ScaledDotProductAttention``
module (causal via ``is_causal``, no per-document mask) is still there. The spring-2026
behaviour this shim restores is exactly the two things that commit removed:

1. ``get_attention_config("sdpa")`` returns ``ScaledDotProductAttention.Config()`` (spring:
   ``(ScaledDotProductAttention.Config(), "causal")``), so every layer attends causally over
   the whole packed row and the trainer builds no attention mask for it;
2. for a model whose attention is SDPA (spring: ``mask_type == "causal"``), the trainer feeds
   RoPE plain ``arange(seq_len)`` positions instead of the dataloader's per-document ones
   (spring's ``Trainer.post_dataloading_process`` does this for every non-block-causal model).

Nothing else changes: flex/varlen models are untouched. Installed in-process by
``harness.upstream.titan_api.v0_3`` when a native config asks for "sdpa" (and by name through
``HARNESS_SHIMS=titan_sdpa_attention``). Delete it when the harness stops supporting 0.3.0,
or when upstream accepts "sdpa" again (tests/selftest/test_upstream_shims.py notices).
"""

from __future__ import annotations

from types import ModuleType

SHIM_NAME = "titan_sdpa_attention"


def accept_sdpa(module: ModuleType) -> None:
    """Make ``module.get_attention_config("sdpa")`` build causal SDPA (idempotent).

    Applied to ``torchtitan.models.common.config_utils`` and to every module that copied the
    function at import (``torchtitan.models.qwen3``).
    """
    original = module.get_attention_config
    if getattr(original, "_harness_shim", None) == SHIM_NAME:
        return

    def get_attention_config(backend: str, *args, **kwargs):
        if backend == "sdpa":
            from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: PLC0415  heavy: torchtitan; the rank's shims install before it loads

            return ScaledDotProductAttention.Config()
        return original(backend, *args, **kwargs)

    get_attention_config.__wrapped__ = original
    get_attention_config._harness_shim = SHIM_NAME
    module.get_attention_config = get_attention_config


def _uses_sdpa(model_config) -> bool:
    from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: PLC0415  heavy: torchtitan; the rank's shims install before it loads

    first = getattr(model_config, "first_attention", None)
    inner = getattr(first, "inner_attention", None)
    return isinstance(inner, ScaledDotProductAttention.Config)


def causal_positions_for_sdpa(trainer_module: ModuleType) -> None:
    """SDPA models get ``arange`` RoPE positions, as spring-2026 ``main`` gave them."""
    cls = trainer_module.Trainer
    original = cls.post_dataloading_process
    if getattr(original, "_harness_shim", None) == SHIM_NAME:
        return

    def post_dataloading_process(self, input_dict, labels):
        positions = input_dict.get("positions")
        if positions is not None and _uses_sdpa(self.model_config):
            import torch  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

            inputs = input_dict["input"]
            input_dict = dict(input_dict)
            input_dict["positions"] = torch.arange(
                inputs.shape[1], dtype=positions.dtype, device=inputs.device
            ).repeat(inputs.shape[0], 1)
        return original(self, input_dict, labels)

    post_dataloading_process.__wrapped__ = original
    post_dataloading_process._harness_shim = SHIM_NAME
    cls.post_dataloading_process = post_dataloading_process


# (module, patch) pairs; harness/upstream/install.py registers each as a post-import hook,
# and harness.upstream.titan_api.v0_3 applies them in-process.
PATCHES = (
    ("torchtitan.models.common.config_utils", accept_sdpa),
    ("torchtitan.models.qwen3", accept_sdpa),
    ("torchtitan.trainer", causal_positions_for_sdpa),
)

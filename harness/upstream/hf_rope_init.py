"""Workaround (opt-in): recompute HF RoPE ``inv_freq`` after the transformers backend's init.

Defect: torchtitan 0.3.0's ``HFTransformerModel.init_states`` recomputes a rotary module's
``inv_freq`` only when the module has a ``rope_init_fn`` attribute. transformers 5.x's
``Qwen3RotaryEmbedding``/``Qwen3MoeRotaryEmbedding`` keep ``rope_init_fn`` as a local in
``__init__``, so after meta-device construction + ``to_empty()`` the buffer keeps
uninitialised memory and RoPE is silently wrong. The harness reports this by name
(tests/e2e, tests/parity); this workaround is applied only when asked for
(``RunSpec(workarounds=("hf_rope_init",))`` / ``--workaround hf_rope_init``).
"""

from __future__ import annotations

from types import ModuleType

SHIM_NAME = "hf_rope_init"


def _recompute_inv_freq(model) -> int:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: PLC0415  heavy: transformers; the rank's shims install before it loads

    fixed = 0
    for module in model.modules():
        if not hasattr(module, "inv_freq") or not hasattr(module, "rope_type"):
            continue
        if module.rope_type == "default":
            init_fn = module.compute_default_rope_parameters
        else:
            init_fn = ROPE_INIT_FUNCTIONS[module.rope_type]
        inv_freq, scaling = init_fn(module.config, module.inv_freq.device)
        module.inv_freq.copy_(inv_freq.to(module.inv_freq.dtype))
        if hasattr(module, "original_inv_freq"):
            module.original_inv_freq.copy_(inv_freq.to(module.original_inv_freq.dtype))
        module.attention_scaling = scaling
        fixed += 1
    return fixed


def recompute_rope_after_init_states(backend_model_module: ModuleType) -> None:
    cls = backend_model_module.HFTransformerModel
    original = cls.init_states

    def init_states(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        import torch  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

        with torch.no_grad():
            _recompute_inv_freq(self.model)
        return result

    init_states.__wrapped__ = original
    cls.init_states = init_states

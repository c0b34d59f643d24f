"""spring-2026 torchtitan: the transformers backend builds the model config.json describes.

Defect (torchtitan ``main`` a9c5edc74, the public base of TorchTitan Neuron 0.2.2+neuron.1):
``HFTransformerModel.Config.update_from_config``
(``torchtitan/experiments/transformers_modeling_backend/model.py``) loads ``hf_model``'s
config.json and then overwrites it with its flavor's ``TitanDenseModelConfig`` ("Update our
attributes with the passed args from flavors": the "full" flavor's defaults are dim 4096, 32
layers, 32 heads), recomputes ``intermediate_size`` llama-style from ``dim`` and sets
``head_dim = dim // n_heads``. So the model built is not the checkpoint's: a Qwen3 config.json
(Qwen3-4B: intermediate 9728, head_dim 128 != 2560 // 32) gets the wrong shape, and loading its
weights fails or, with a shape that happens to fit, trains a different model. torchtitan 0.3.0
builds exactly what config.json says.

Shim: after spring's ``update_from_config``, the shape fields (``SHAPE_KEYS``) are set back to
config.json's values; everything else the backend chooses (``max_position_embeddings`` from
``training.seq_len``, its init settings, attention implementation) is kept.

Applied by ``harness.upstream.titan_api.spring2026`` in-process (and by name through
``HARNESS_SHIMS=hf_shape_from_config``). tests/selftest/test_upstream_shims.py notices when
the generation no longer needs it.
"""

from __future__ import annotations

from types import ModuleType

SHIM_NAME = "hf_shape_from_config"

SHAPE_KEYS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "intermediate_size", "vocab_size", "rms_norm_eps", "rope_parameters",
    "layer_types",
)


def keep_config_json_shape(model_module: ModuleType) -> None:
    """Wrap ``HFTransformerModel.Config.update_from_config`` (idempotent)."""
    cls = model_module.HFTransformerModel.Config
    original = cls.update_from_config
    if getattr(original, "_harness_shim", None) == SHIM_NAME:
        return

    def update_from_config(self, *, config=None, **kwargs):
        result = original(self, config=config, **kwargs)
        from transformers import AutoConfig  # noqa: PLC0415  heavy: transformers; the rank's shims install before it loads

        hf = AutoConfig.from_pretrained(
            getattr(config, "hf_model", ""),
            attn_implementation=self.attn_implementation,
            trust_remote_code=True,
        )
        for key in SHAPE_KEYS:
            if hasattr(hf, key):
                setattr(self, key, getattr(hf, key))
        return result

    update_from_config.__wrapped__ = original
    update_from_config._harness_shim = SHIM_NAME
    cls.update_from_config = update_from_config


PATCHES = (
    ("torchtitan.experiments.transformers_modeling_backend.model", keep_config_json_shape),
)

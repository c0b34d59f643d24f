"""Backend 1: torchtitan's transformers (v5) modeling backend.

The HF model class is built from ``hf_model``'s config.json (a local dir: nothing comes from
the Hub); weights arrive through ``checkpoint.initial_load_in_hf`` from ``hf_assets_path``,
and leave as HF safetensors with ``checkpoint.last_save_in_hf``. The "full" flavor takes
every shape field from config.json, so tiny and full differ only in the directory.
"""

from torchtitan.experiments.transformers_modeling_backend import model_registry
from torchtitan.experiments.transformers_modeling_backend.configs import (
    TransformersBackendConfig,
)

from harness.backends import paths
from harness.backends.common import FULL, TINY, shared_fields
from harness.backends.titan_native import FULL_ASSETS


def _config(model_dir: str, shape) -> TransformersBackendConfig:
    return TransformersBackendConfig(
        hf_model=model_dir,
        model_spec=model_registry("full"),
        **shared_fields(shape, hf_assets_path=model_dir),
    )


def tiny() -> TransformersBackendConfig:
    return _config(str(paths.TINY_DENSE), TINY)


def full() -> TransformersBackendConfig:
    return _config(FULL_ASSETS, FULL)

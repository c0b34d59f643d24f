"""Backend 1: torchtitan's transformers (v5) modeling backend.

The HF model class is built from ``hf_model``'s config.json (a local dir: nothing comes from
the Hub); weights arrive through ``checkpoint.initial_load_in_hf`` from ``hf_assets_path``,
and leave as HF safetensors with ``checkpoint.last_save_in_hf``. The "full" flavor takes
every shape field from config.json, so tiny and full differ only in the directory.

The backend's classes come from harness.upstream.titan_api: on spring-2026 ``main`` they need three
shims (harness/upstream/hf_config_kw_only.py, hf_shape_from_config.py, hf_tied_fsdp.py), and
each generation routes HF attention differently (``titan_api.transformers_backend().attention``).
"""

from harness.backends.common import FULL, TINY, full_assets, shared_fields
from harness.backends.titan_native import FULL_ASSETS
from harness.registry import paths
from harness.upstream import titan_api

_backend = titan_api.transformers_backend()
TransformersBackendConfig = _backend.TransformersBackendConfig


def _config(model_dir: str, shape) -> TransformersBackendConfig:
    return TransformersBackendConfig(
        hf_model=model_dir,
        model_spec=_backend.model_registry("full"),
        **shared_fields(shape, hf_assets_path=model_dir),
    )


def tiny() -> TransformersBackendConfig:
    return _config(str(paths.TINY_DENSE), TINY)


def full() -> TransformersBackendConfig:
    return _config(full_assets(FULL_ASSETS), FULL)

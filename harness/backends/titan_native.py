"""Backend 2: torchtitan's native Qwen3, weights through torchtitan's HF state-dict adapter.

``tiny``: the tiny dense fixture's shape (fixtures/tiny_dense/config.json).
``full``: torchtitan's own "4B" flavor, as users run it against Qwen3-4B-Instruct-2507.

Attention, as the source's configurations build it: ``model_registry(.., attn_backend="sdpa")``,
causal over the packed row (``tiny``, ``full``). ``tiny_flex``/``full_flex``: FlexAttention
with the per-document (block-causal) mask. See harness.upstream.titan_api.ATTN_BACKENDS.
"""

from torchtitan.trainer import Trainer

from harness.backends.common import FULL, TINY, assets_config, full_assets, shared_fields
from harness.backends.native_qwen3 import DEFAULT_ATTN_BACKEND, model_spec_from_hf
from harness.registry import paths
from harness.upstream import titan_api

# The default assets dir; the launcher sets the run's (harness/registry/environment.py
# FULL_ASSETS, --hf_assets_path).
FULL_ASSETS = "./assets/hf/Qwen3-4B-Instruct-2507"
# Qwen3-4B's shape: assets of this shape get torchtitan's own "4B" flavor, as users run it.
QWEN3_4B_SHAPE = {"vocab_size": 151936, "hidden_size": 2560, "num_hidden_layers": 36}


def _tiny(attn_backend: str) -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_spec_from_hf(paths.TINY_DENSE, flavor="tiny_dense",
                                      attn_backend=attn_backend),
        **shared_fields(TINY, hf_assets_path=str(paths.TINY_DENSE)),
    )


def full_model_spec(assets: str, attn_backend: str):
    """torchtitan's "4B" flavor (the source's configuration) for Qwen3-4B's assets; for the
    CPU twin's (another shape) the same builders at the twin's shape."""
    hf = assets_config(assets)
    if hf is None or all(hf[k] == v for k, v in QWEN3_4B_SHAPE.items()):
        return titan_api.qwen3_model_registry("4B", attn_backend)
    return model_spec_from_hf(assets, flavor="4B_twin", attn_backend=attn_backend)


def _full(attn_backend: str) -> Trainer.Config:
    assets = full_assets(FULL_ASSETS)
    return Trainer.Config(
        model_spec=full_model_spec(assets, attn_backend),
        **shared_fields(FULL, hf_assets_path=assets),
    )


def tiny() -> Trainer.Config:
    return _tiny(DEFAULT_ATTN_BACKEND)


def tiny_flex() -> Trainer.Config:
    return _tiny("flex")


def full() -> Trainer.Config:
    return _full(DEFAULT_ATTN_BACKEND)


def full_flex() -> Trainer.Config:
    return _full("flex")

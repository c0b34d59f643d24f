"""Backend 2: torchtitan's native Qwen3, weights through torchtitan's HF state-dict adapter.

``tiny``: the tiny dense fixture's shape (fixtures/tiny_dense/config.json).
``full``: torchtitan's own "4B" flavor, as users run it against Qwen3-4B-Instruct-2507.

Attention, as the source's configurations build it: ``model_registry(.., attn_backend="sdpa")``,
causal over the packed row (``tiny``, ``full``). ``tiny_flex``/``full_flex``: FlexAttention
with the per-document (block-causal) mask. See harness.titan_api.ATTN_BACKENDS.
"""

from torchtitan.trainer import Trainer

from harness import titan_api
from harness import paths
from harness.backends.common import FULL, TINY, shared_fields
from harness.backends.native_qwen3 import DEFAULT_ATTN_BACKEND, model_spec_from_hf

# Set by the launcher for full-size runs (--hf_assets_path overrides it too).
FULL_ASSETS = "./assets/hf/Qwen3-4B-Instruct-2507"


def _tiny(attn_backend: str) -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_spec_from_hf(paths.TINY_DENSE, flavor="tiny_dense",
                                      attn_backend=attn_backend),
        **shared_fields(TINY, hf_assets_path=str(paths.TINY_DENSE)),
    )


def _full(attn_backend: str) -> Trainer.Config:
    return Trainer.Config(
        model_spec=titan_api.qwen3_model_registry("4B", attn_backend),
        **shared_fields(FULL, hf_assets_path=FULL_ASSETS),
    )


def tiny() -> Trainer.Config:
    return _tiny(DEFAULT_ATTN_BACKEND)


def tiny_flex() -> Trainer.Config:
    return _tiny("flex")


def full() -> Trainer.Config:
    return _full(DEFAULT_ATTN_BACKEND)


def full_flex() -> Trainer.Config:
    return _full("flex")

"""Backend 2: torchtitan's native Qwen3, weights through torchtitan's HF state-dict adapter.

``tiny``: the tiny dense fixture's shape (fixtures/tiny_dense/config.json).
``full``: torchtitan's own "4B" flavor, as users run it against Qwen3-4B-Instruct-2507.
"""

from torchtitan.models.qwen3 import model_registry
from torchtitan.trainer import Trainer

from harness.backends import paths
from harness.backends.common import FULL, TINY, shared_fields
from harness.backends.native_qwen3 import model_spec_from_hf

# Set by the launcher for full-size runs (--hf_assets_path overrides it too).
FULL_ASSETS = "./assets/hf/Qwen3-4B-Instruct-2507"


def tiny() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_spec_from_hf(paths.TINY_DENSE, flavor="tiny_dense"),
        **shared_fields(TINY, hf_assets_path=str(paths.TINY_DENSE)),
    )


def full() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_registry("4B"),
        **shared_fields(FULL, hf_assets_path=FULL_ASSETS),
    )

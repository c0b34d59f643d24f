"""Backend 3: native Qwen3 MoE with RoPE and the expert MLP as custom operators.

The operators (harness/kernels/ops) are registered with torch.library: on neuron their
implementation is an NKI kernel, elsewhere a torch kernel, so the registration, autograd and
module swap run on every device. Eager, as on Trainium.

``tiny``: the tiny MoE fixture's shape (fixtures/tiny_moe/config.json).
``full``: Qwen3-30B-A3B's shape cut to 4 layers, 64 experts, top-4
(fixtures/reference_configs/qwen3_30b_a3b_4l_64e_top4/config.json).

Attention, as the source's configurations build native Qwen3: "sdpa", causal over the packed
row (``tiny``, ``full``); ``tiny_flex``/``full_flex``: FlexAttention with the per-document
(block-causal) mask. See harness.upstream.titan_api.ATTN_BACKENDS.
"""

from torchtitan.trainer import Trainer

from harness.backends.common import FULL, TINY, assets_config, full_assets, shared_fields
from harness.backends.native_qwen3 import DEFAULT_ATTN_BACKEND, model_spec_from_hf
from harness.kernels.ops import use_custom_ops
from harness.registry import paths

FULL_SHAPE = paths.FIXTURES / "reference_configs" / "qwen3_30b_a3b_4l_64e_top4"
# The default assets dir; the launcher sets the run's own (harness/registry/assets_twin.py: the MoE's
# config.json and Qwen3's tokenizer, no index).
FULL_ASSETS = "./assets/hf/qwen3_30b_a3b_4l_64e_top4"


def _config(model_dir, flavor: str, shape, hf_assets_path: str,
            attn_backend: str) -> Trainer.Config:
    spec = model_spec_from_hf(model_dir, flavor=flavor, attn_backend=attn_backend)
    spec.model = use_custom_ops(spec.model)
    return Trainer.Config(model_spec=spec, **shared_fields(shape, hf_assets_path=hf_assets_path))


def _tiny(attn_backend: str) -> Trainer.Config:
    return _config(paths.TINY_MOE, "tiny_moe", TINY, str(paths.TINY_MOE), attn_backend)


def _full(attn_backend: str) -> Trainer.Config:
    # Random init only, from its own assets dir, whose config.json is the model's shape (the
    # reference cut on trn2, the tiny MoE in the CPU twin).
    assets = full_assets(FULL_ASSETS)
    shape = assets if assets_config(assets) is not None else FULL_SHAPE
    return _config(shape, "30b_a3b_4l_64e_top4", FULL, assets, attn_backend)


def tiny() -> Trainer.Config:
    return _tiny(DEFAULT_ATTN_BACKEND)


def tiny_flex() -> Trainer.Config:
    return _tiny("flex")


def full() -> Trainer.Config:
    return _full(DEFAULT_ATTN_BACKEND)


def full_flex() -> Trainer.Config:
    return _full("flex")

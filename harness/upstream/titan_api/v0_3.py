"""torchtitan 0.3.0 (PyPI, September 2026): the names harness.upstream.titan_api exposes.

Each definition says how it differs from spring-2026 ``main`` (spring2026.py) and why.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import torchtitan.models.qwen3 as qwen3

# 0.3.0 moved the LR scheduler into the optimizer package (components/optimizer/lr_scheduler.py).
from torchtitan.components.optimizer import LRSchedulersContainer as LRSchedulersContainer

# Same class in both; 0.3.0's dataset shifts labels within each document (a document's last
# token never predicts the next document's first), spring's shifts across the packed row.
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader as HuggingFaceTextDataLoader

from harness.upstream import titan_sdpa_attention

GENERATION = "v0_3"

# 0.3.0 rejects "sdpa" for language models (#3571); the titan_sdpa_attention shim restores it.
ATTN_BACKENDS = {
    "sdpa": "causal attention over the whole packed row, RoPE positions 0..seq_len-1 "
            "(spring-2026 behaviour, restored on 0.3.0 by the titan_sdpa_attention shim)",
    "flex": "FlexAttention, block-causal: attention and RoPE positions confined to each "
            "packed document",
}

# Upstream shims a CPU run needs, per model kind (cpu_device: device falls back to cuda;
# gloo_reduce_op: FSDP2 PREMUL_SUM; flex_attention_cpu: flex backward refused on CPU).
CPU_SHIMS = {
    "native-sdpa": ("cpu_device", "gloo_reduce_op"),
    "native-flex": ("cpu_device", "flex_attention_cpu", "gloo_reduce_op"),
    # 0.3.0's transformers backend routes HF attention through flex ("flex_torchtitan").
    "transformers": ("cpu_device", "flex_attention_cpu", "gloo_reduce_op"),
}


def require_attn_backend(attn_backend: str) -> None:
    """Make ``attn_backend`` buildable by torchtitan's native layer builders."""
    if attn_backend not in ATTN_BACKENDS:
        raise ValueError(
            f"attn_backend {attn_backend!r} is not one the harness runs; choose from "
            f"{sorted(ATTN_BACKENDS)}"
        )
    if attn_backend == "sdpa":
        # Patched in-process (the config is built in the rank that trains it); idempotent.
        for module_name, patch in titan_sdpa_attention.PATCHES:
            patch(importlib.import_module(module_name))


def qwen3_model_registry(flavor: str, attn_backend: str):
    """``torchtitan.models.qwen3.model_registry`` (0.3.0 defaults to "flex"; always explicit)."""
    require_attn_backend(attn_backend)
    return qwen3.model_registry(flavor, attn_backend=attn_backend)


def qwen3_lm_head_init(dim: int) -> dict:
    """0.3.0's Qwen3 flavors init the output projection like every linear: normal(0.02)."""
    return qwen3._LINEAR_INIT


def transformers_backend() -> SimpleNamespace:
    """torchtitan's transformers modeling backend (imports cleanly on 0.3.0)."""
    from torchtitan.experiments.transformers_modeling_backend import model_registry  # noqa: PLC0415  heavy: transformers, for the HF backend alone
    from torchtitan.experiments.transformers_modeling_backend.configs import (  # noqa: PLC0415  heavy: transformers, for the HF backend alone
        TransformersBackendConfig,
    )
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel  # noqa: PLC0415  heavy: transformers, for the HF backend alone
    from torchtitan.experiments.transformers_modeling_backend.state_dict_adapter import (  # noqa: PLC0415  heavy: transformers, for the HF backend alone
        HFTransformerStateDictAdapter,
    )

    return SimpleNamespace(
        TransformersBackendConfig=TransformersBackendConfig,
        model_registry=model_registry,
        HFTransformerModel=HFTransformerModel,
        # 0.3.0: HFTransformerTrainer; attention through flex with a causal BlockMask.
        attention="flex (HF AttentionInterface 'flex_torchtitan'), causal mask",
        # How it masks packed rows: its BlockMask is causal over the row while RoPE gets the
        # dataloader's per-document positions ("causal"); attn_mask_type "block_causal" gives
        # the per-document mask (the hf_block_causal workaround).
        masking="causal",
        block_causal=True,
        # HF safetensors in and out (checkpoint.initial_load_in_hf / last_save_in_hf).
        state_dict_adapter=HFTransformerStateDictAdapter,
    )


def moe_grouped_experts(moe):
    """The ``GroupedExperts`` of an MoE layer (its ``.Config`` of an MoE layer config, the built
    module of a built layer): 0.3.0 nests it in a RoutedExperts region
    (``moe.routed_experts.inner_experts``, the EP ``local_map`` boundary)."""
    return moe.routed_experts.inner_experts


# Where ``moe_grouped_experts`` sits under an MoE layer, as a module path (for messages).
MOE_GROUPED_EXPERTS_PATH = "routed_experts.inner_experts"


# The GroupedExperts method that computes the experts' SwiGLU on already-dispatched tokens,
# ``(x_RD, num_tokens_per_expert_E) -> out_RD``: 0.3.0 dispatches outside it, in RoutedExperts.
GROUPED_EXPERTS_COMPUTE_METHOD = "forward"


def grouped_experts_config(config_cls, *, dim: int, hidden_dim: int, num_experts: int):
    """A ``GroupedExperts.Config`` (or a subclass's) for the experts' compute alone."""
    return config_cls(dim=dim, hidden_dim=hidden_dim, num_experts=num_experts)


def call_loss(loss_fn, pred, labels, *args):
    """The loss of a built torchtitan loss (``args``: e.g. the global valid-token count it
    normalises by): 0.3.0 returns ``(loss, metrics)``."""
    loss, _metrics = loss_fn(pred, labels, *args)
    return loss


# How the pretraining dataset packs documents into rows (harness/references/data.py implements
# both): 0.3.0 shifts within each document (inputs doc[:-1], labels doc[1:]) and cuts rows of
# exactly seq_len, so a document's last token never predicts the next document's first;
# positions restart at 0 per document and at each row start.
TEXT_PACKING = "within_document"


def post_dataloading_parts(processed) -> tuple:
    """``Trainer.post_dataloading_process``'s result as ``(inputs, labels, model_kwargs)``
    (``model_kwargs``: positions, attention masks): 0.3.0 returns exactly these three."""
    inputs, labels, extra_kwargs = processed
    return inputs, labels, dict(extra_kwargs)


# Every test of the harness runs on this generation.
NOT_PORTED: tuple[tuple[str, str], ...] = ()

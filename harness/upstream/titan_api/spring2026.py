"""torchtitan ``main`` of spring 2026 (0.2.2+main.*; TorchTitan Neuron 0.2.2+neuron.1 forks it).

The names harness.upstream.titan_api exposes; each says how it differs from 0.3.0 (v0_3.py) and why.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import torchtitan.models.qwen3 as qwen3

# spring main keeps the LR scheduler in its own module (0.3.0 moved it into optimizer/).
from torchtitan.components.lr_scheduler import LRSchedulersContainer as LRSchedulersContainer

# Same class in both; spring's dataset shifts labels across the packed row (a document's
# last token predicts the next document's first), 0.3.0's within each document.
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader as HuggingFaceTextDataLoader

from harness.upstream import hf_config_kw_only, hf_shape_from_config, hf_tied_fsdp

GENERATION = "spring2026"

# spring main still builds language models with "sdpa" (removed by #3571 on 2026-06-09).
ATTN_BACKENDS = {
    "sdpa": "causal attention over the whole packed row, RoPE positions 0..seq_len-1 "
            "(mask_type 'causal'; the source's configurations)",
    "flex": "FlexAttention, block-causal: attention and RoPE positions confined to each "
            "packed document (mask_type 'block_causal')",
}

# Upstream shims a CPU run needs, per model kind (cpu_device: device falls back to cuda;
# gloo_reduce_op: FSDP2 PREMUL_SUM; flex_attention_cpu: flex backward refused on CPU).
CPU_SHIMS = {
    "native-sdpa": ("cpu_device", "gloo_reduce_op"),
    "native-flex": ("cpu_device", "flex_attention_cpu", "gloo_reduce_op"),
    # spring's transformers backend routes HF attention through SDPA ("sdpa_torchtitan").
    "transformers": ("cpu_device", "gloo_reduce_op"),
}


def require_attn_backend(attn_backend: str) -> None:
    """spring main builds both natively: nothing to install, only the name to check."""
    if attn_backend not in ATTN_BACKENDS:
        raise ValueError(
            f"attn_backend {attn_backend!r} is not one the harness runs; choose from "
            f"{sorted(ATTN_BACKENDS)}"
        )


def qwen3_model_registry(flavor: str, attn_backend: str):
    """``torchtitan.models.qwen3.model_registry`` (spring defaults to "sdpa"; always explicit)."""
    require_attn_backend(attn_backend)
    return qwen3.model_registry(flavor, attn_backend=attn_backend)


def qwen3_lm_head_init(dim: int) -> dict:
    """spring's Qwen3 flavors init the output projection trunc-normal(dim**-0.5, +-3 std)."""
    return qwen3._output_linear_init(dim)


def transformers_backend() -> SimpleNamespace:
    """torchtitan's transformers modeling backend. Needs three shims on this generation (see
    their modules): hf_config_kw_only (it does not import with transformers 5.x),
    hf_shape_from_config (its flavor overrides config.json's shape) and hf_tied_fsdp (FSDP
    fails on tied embeddings).
    """
    for shim in (hf_config_kw_only, hf_shape_from_config, hf_tied_fsdp):  # idempotent
        for module_name, patch in shim.PATCHES:
            patch(importlib.import_module(module_name))
    from torchtitan.experiments.transformers_modeling_backend import model_registry  # noqa: PLC0415  order: after the shims above patch their modules
    from torchtitan.experiments.transformers_modeling_backend.configs import (  # noqa: PLC0415  order: after the shims above patch their modules
        TransformersBackendConfig,
    )
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel  # noqa: PLC0415  order: after the shims above patch their modules

    return SimpleNamespace(
        TransformersBackendConfig=TransformersBackendConfig,
        model_registry=model_registry,
        HFTransformerModel=HFTransformerModel,
        # spring: the plain Trainer; attention through SDPA, causal (is_causal).
        attention="sdpa (HF AttentionInterface 'sdpa_torchtitan'), causal",
        # How it masks packed rows (harness.references.batch Batch.masked_as): spring's
        # HFTransformerModel.forward replaces the positions with 0..L-1 and its SDPA is causal,
        # so it is native sdpa's model, "row_causal"; attn_mask_type is declared but unused,
        # so no setting gives a per-document mask (block_causal False).
        masking="row_causal",
        block_causal=False,
        # spring's backend has no state_dict_adapter module (model_registry passes
        # state_dict_adapter=None): known issue spring2026-hf_v5-no-hf-state-dict-adapter.
        state_dict_adapter=None,
    )


def moe_grouped_experts(moe):
    """The ``GroupedExperts`` of an MoE layer (its ``.Config`` of an MoE layer config, the built
    module of a built layer): spring holds it directly (``moe.experts``; 0.3.0 later wrapped it
    in a RoutedExperts region)."""
    return moe.experts


# Where ``moe_grouped_experts`` sits under an MoE layer, as a module path (for messages).
MOE_GROUPED_EXPERTS_PATH = "experts"


# The GroupedExperts method that computes the experts' SwiGLU on already-dispatched tokens,
# ``(x_RD, num_tokens_per_expert_E) -> out_RD``: spring's ``forward`` also dispatches and
# combines (its token_dispatcher), and calls ``_experts_forward`` for the compute.
GROUPED_EXPERTS_COMPUTE_METHOD = "_experts_forward"


def grouped_experts_config(config_cls, *, dim: int, hidden_dim: int, num_experts: int):
    """A ``GroupedExperts.Config`` (or a subclass's) for the experts' compute alone. Spring's
    config also takes the token dispatcher, which only ``forward`` (dispatch and combine)
    uses; the compute method never calls it, so its top_k is immaterial."""
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher  # noqa: PLC0415  generation: a spring-2026 torchtitan module

    return config_cls(dim=dim, hidden_dim=hidden_dim, num_experts=num_experts,
                      token_dispatcher=LocalTokenDispatcher.Config(num_experts=num_experts, top_k=1))


def call_loss(loss_fn, pred, labels, *args):
    """The loss of a built torchtitan loss (``args``: e.g. the global valid-token count it
    normalises by): spring returns the tensor alone."""
    return loss_fn(pred, labels, *args)


# How the pretraining dataset packs documents into rows (harness/references/data.py implements
# both): spring appends every document to one token stream and cuts rows of seq_len + 1, inputs
# row[:-1] and labels row[1:], so a document's last token (its EOS) predicts the next
# document's first token, and the row's last token is a label only; positions restart at 0 per
# document and at each row start.
TEXT_PACKING = "across_row"


def post_dataloading_parts(processed) -> tuple:
    """``Trainer.post_dataloading_process``'s result as ``(inputs, labels, model_kwargs)``
    (``model_kwargs``: positions, attention masks): spring returns four values, ``(inputs,
    labels, extra_inputs, extra_kwargs)``, the model getting both dicts."""
    inputs, labels, extra_inputs, extra_kwargs = processed
    return inputs, labels, {**extra_inputs, **extra_kwargs}


# Every suite runs on this generation (the parity, conformance, data-path, SFT and
# training-state references follow it where it differs: the names above).
NOT_PORTED: tuple[tuple[str, str], ...] = ()

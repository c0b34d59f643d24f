"""Native torchtitan Qwen3 model configs for the harness's model shapes.

torchtitan registers fixed flavors ("debugmodel", "4B", "30B-A3B", ...). The tiny
fixture models and the 4-layer / 64-expert / top-4 cut of 30B-A3B are not among them, so
their native configs are built here with the same private layer builders torchtitan's own
flavors use (``torchtitan.models.qwen3._build_qwen3_layers`` and friends), taking only the
*shape* from the HF config.json. Everything the builders hard-code (RMSNorm eps, init, router
normalisation, load balancing, fused or separate QKV) stays torchtitan's, so the
config-conformance check compares torchtitan's choices with HF's instead of copying HF's into
torchtitan. What differs between torchtitan generations (the output-projection init, whether
"sdpa" builds) comes from harness.upstream.titan_api.

The attention backend is a parameter: "sdpa" (the source's configurations: causal attention
over the packed row, no per-document mask) or "flex" (FlexAttention, block-causal: each packed
document attends only to itself). See ``harness.upstream.titan_api.ATTN_BACKENDS``.
"""

from __future__ import annotations

from pathlib import Path

import torchtitan.models.qwen3 as qwen3
from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.qwen3.model import Qwen3Model
from torchtitan.protocols.model_spec import ModelSpec

from harness.registry.hf_config import num_experts, rope_theta
from harness.registry.hf_config import read_config_json as read_hf_config
from harness.upstream import titan_api

# The source's configurations build native Qwen3 with model_registry(.., attn_backend="sdpa").
DEFAULT_ATTN_BACKEND = "sdpa"


def native_config_from_hf(hf: dict, attn_backend: str = "flex") -> Qwen3Model.Config:
    """The native config for an HF config dict.

    The default stays "flex" (document-masked) because the parity helpers
    (harness/parity/models.py) build masks with ``get_attention_masks``, which only masked
    backends have; the backends pass ``attn_backend`` explicitly (``model_spec_from_hf``).
    """
    titan_api.require_attn_backend(attn_backend)
    dim = hf["hidden_size"]
    n_heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or dim // n_heads
    vocab = hf["vocab_size"]
    tied = bool(hf.get("tie_word_embeddings", False))
    rope = CosSinRoPE.Config(
        dim=head_dim, max_seq_len=hf["max_position_embeddings"], theta=rope_theta(hf)
    )
    common = dict(
        n_layers=hf["num_hidden_layers"],
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=hf["num_key_value_heads"],
        head_dim=head_dim,
        attn_backend=attn_backend,
        rope=rope,
    )
    if num_experts(hf) > 0:
        layers = qwen3._build_qwen3_moe_layers(
            **common,
            moe_hidden_dim=hf["moe_intermediate_size"],
            num_experts=num_experts(hf),
            top_k=hf["num_experts_per_tok"],
            moe_comm_backend="standard",
        )
    else:
        layers = qwen3._build_qwen3_layers(**common, hidden_dim=hf["intermediate_size"])
    return Qwen3Model.Config(
        vocab_size=vocab,
        dim=dim,
        norm=qwen3._qwen3_norm(dim),
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab,
            embedding_dim=dim,
            # torchtitan's tied flavors skip embedding init (the tied lm_head inits it).
            param_init=qwen3._EMBEDDING_SKIP_INIT if tied else qwen3._EMBEDDING_INIT,
        ),
        lm_head=Linear.Config(
            in_features=dim, out_features=vocab, param_init=titan_api.qwen3_lm_head_init(dim)
        ),
        layers=layers,
    )


def model_spec_from_hf(
    model_dir: str | Path, flavor: str, attn_backend: str = DEFAULT_ATTN_BACKEND
) -> ModelSpec:
    """A torchtitan ModelSpec for the HF model in ``model_dir`` (shape taken from config.json)."""
    spec = titan_api.qwen3_model_registry("debugmodel", attn_backend)
    spec.model = native_config_from_hf(read_hf_config(model_dir), attn_backend)
    spec.flavor = flavor
    return spec

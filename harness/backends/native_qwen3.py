"""Native torchtitan Qwen3 model configs for the harness's model shapes.

torchtitan 0.3.0 registers fixed flavors ("debugmodel", "4B", "30B-A3B", ...). The tiny
fixture models and the 4-layer / 64-expert / top-4 cut of 30B-A3B are not among them, so
their native configs are built here with the same private layer builders torchtitan's own
flavors use (``torchtitan.models.qwen3._build_qwen3_layers`` and friends), taking only the
*shape* from the HF config.json. Everything the builders hard-code (RMSNorm eps, init, router
normalisation, load balancing) stays torchtitan's, so the config-conformance check compares
torchtitan's choices with HF's instead of copying HF's into torchtitan.
"""

from __future__ import annotations

import json
from pathlib import Path

import torchtitan.models.qwen3 as qwen3
from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.qwen3.model import Qwen3Model
from torchtitan.protocols.model_spec import ModelSpec


def read_hf_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no config.json in {model_dir}: an HF model dir needs one "
            f"(regenerate fixtures with `python scripts/make_fixtures.py`)"
        )
    return json.loads(path.read_text())


def rope_theta(hf: dict) -> float:
    """rope theta from a transformers 4.x (``rope_theta``) or 5.x (``rope_parameters``) config."""
    params = hf.get("rope_parameters") or {}
    theta = params.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise KeyError("config.json has neither rope_parameters.rope_theta nor rope_theta")
    return float(theta)


def num_experts(hf: dict) -> int:
    """Routed experts per MoE layer; 0 for a dense model.

    transformers 4.x configs say ``num_experts``; transformers 5.x's ``save_pretrained`` writes
    ``num_local_experts`` (Qwen3MoeConfig maps one to the other).
    """
    count = int(hf.get("num_experts") or hf.get("num_local_experts") or 0)
    if count == 0 and hf.get("model_type") == "qwen3_moe":
        raise ValueError("a qwen3_moe config.json without num_experts/num_local_experts")
    return count


def is_moe(hf: dict) -> bool:
    return num_experts(hf) > 0


def native_config_from_hf(hf: dict, attn_backend: str = "flex") -> Qwen3Model.Config:
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
    if is_moe(hf):
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
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=qwen3._LINEAR_INIT),
        layers=layers,
    )


def model_spec_from_hf(model_dir: str | Path, flavor: str, attn_backend: str = "flex") -> ModelSpec:
    """A torchtitan ModelSpec for the HF model in ``model_dir`` (shape taken from config.json)."""
    spec = qwen3.model_registry("debugmodel", attn_backend=attn_backend)
    spec.model = native_config_from_hf(read_hf_config(model_dir), attn_backend)
    spec.flavor = flavor
    return spec

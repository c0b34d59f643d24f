"""Effective settings of a built model, read from its modules (not from constants or configs).

Each model kind is reduced to the same canonical keys so two models' settings line up side by
side and the first difference can be named. Values come from what the model will actually
compute with: RMSNorm eps from every norm module, RoPE theta recovered from the RoPE buffer
the forward pass reads (``inv_freq`` / torchtitan's cos-sin cache), weight tying from tensor
identity, MoE routing from the router modules.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from harness.upstream import titan_api

CANONICAL_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
    "tie_word_embeddings", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "norm_topk_prob", "router_score_func", "route_scale", "attention_mask",
)


DOCUMENT_CAUSAL = "document-causal"


def theta_from_inv_freq(inv_freq: torch.Tensor, head_dim: int) -> float:
    """inv_freq[i] = theta ** (-2i / head_dim)  =>  theta = inv_freq[1] ** (-head_dim / 2)."""
    value = float(inv_freq.detach().double().flatten()[1])
    if not math.isfinite(value) or value <= 0.0:
        return float("nan")
    try:
        return value ** (-head_dim / 2.0)
    except OverflowError:  # garbage buffer (e.g. uninitialised memory)
        return float("inf")


def theta_from_cos_sin_cache(cache: torch.Tensor, head_dim: int) -> float:
    """torchtitan CosSinRoPE cache row p = [cos(p*f), cos(p*f), sin(p*f), sin(p*f)] (halves);
    row 1 holds the frequencies themselves: f_1 = atan2(sin, cos) at column 1."""
    if cache.device.type == "meta" or cache.shape[0] < 2:
        return float("nan")
    row = cache[1].double()
    angle = math.atan2(float(row[head_dim + 1]), float(row[1]))
    return theta_from_inv_freq(torch.tensor([1.0, angle]), head_dim)


def _norm_eps(modules) -> float | str:
    values = sorted({float(getattr(m, "eps", getattr(m, "variance_epsilon", float("nan"))))
                     for m in modules})
    return values[0] if len(values) == 1 else f"mixed {values}"


def hf_settings(model: nn.Module, *, attn_mask: str) -> dict:
    """A transformers Qwen3/Qwen3-MoE ForCausalLM (or the module inside HFTransformerModel)."""
    base = model.model
    layers = list(base.layers.values()) if isinstance(base.layers, nn.ModuleDict) else list(base.layers)
    att = layers[0].self_attn
    cfg = model.config
    norms = [m for m in model.modules() if "RMSNorm" in type(m).__name__]
    out = {
        "vocab_size": base.embed_tokens.weight.shape[0],
        "hidden_size": base.embed_tokens.weight.shape[1],
        "num_hidden_layers": len(layers),
        "num_attention_heads": att.q_proj.weight.shape[0] // att.head_dim,
        "num_key_value_heads": att.k_proj.weight.shape[0] // att.head_dim,
        "head_dim": att.head_dim,
        "rms_norm_eps": _norm_eps(norms),
        "rope_theta": theta_from_inv_freq(base.rotary_emb.inv_freq, att.head_dim),
        "tie_word_embeddings": model.lm_head.weight is base.embed_tokens.weight,
        "attention_mask": attn_mask,
        "attn_implementation": cfg._attn_implementation,
    }
    dense = [layer.mlp for layer in layers if hasattr(layer.mlp, "gate_proj")]
    moe = [layer.mlp for layer in layers if hasattr(layer.mlp, "experts")]
    out["intermediate_size"] = dense[0].gate_proj.weight.shape[0] if dense else None
    if moe:
        gate, experts = moe[0].gate, moe[0].experts
        out.update(
            num_experts=gate.weight.shape[0],
            num_experts_per_tok=gate.top_k,
            moe_intermediate_size=experts.down_proj.shape[-1],
            norm_topk_prob=bool(gate.norm_topk_prob),
            router_score_func="softmax",  # hard-coded in Qwen3MoeTopKRouter.forward
            route_scale=1.0,
        )
    else:
        out.update(num_experts=0)
    return out


def native_settings(model: nn.Module, *, attn_mask: str = DOCUMENT_CAUSAL) -> dict:
    """A torchtitan Qwen3Model (built; meta tensors allowed except for the RoPE theta)."""
    layers = [model.layers[k] for k in sorted(model.layers.keys(), key=int)]
    att = layers[0].attention
    norms = [m for m in model.modules() if isinstance(m, nn.RMSNorm)]
    out = {
        "vocab_size": model.tok_embeddings.weight.shape[0],
        "hidden_size": model.tok_embeddings.weight.shape[1],
        "num_hidden_layers": len(layers),
        "num_attention_heads": att.n_heads,
        "num_key_value_heads": att.n_kv_heads,
        "head_dim": att.head_dim,
        "rms_norm_eps": _norm_eps(norms),
        "rope_theta": theta_from_cos_sin_cache(att.rope.cache, att.head_dim)
        if hasattr(att.rope, "cache") else float("nan"),
        "rope_theta_config": att.rope.config.theta,
        "tie_word_embeddings": model.lm_head.weight is model.tok_embeddings.weight,
        "attention_mask": attn_mask,
    }
    dense = [layer.feed_forward for layer in layers if not getattr(layer, "moe_enabled", False)]
    moe = [layer.moe for layer in layers if getattr(layer, "moe_enabled", False)]
    out["intermediate_size"] = dense[0].w1.weight.shape[0] if dense else None
    if moe:
        router, experts = moe[0].router, titan_api.moe_grouped_experts(moe[0])
        out.update(
            num_experts=router.num_experts,
            num_experts_per_tok=router.top_k,
            moe_intermediate_size=experts.w1_EFD.shape[1],
            norm_topk_prob=bool(router.route_norm),
            router_score_func=router.score_func,
            route_scale=float(router.route_scale),
            expert_bias=moe[0].expert_bias_E is not None,
        )
    else:
        out.update(num_experts=0)
    return out


def arch_settings(arch) -> dict:
    out = {k: getattr(arch, k) for k in CANONICAL_KEYS if hasattr(arch, k)}
    out["attention_mask"] = DOCUMENT_CAUSAL
    if all(arch.layer_is_moe(i) for i in range(arch.num_hidden_layers)):
        out["intermediate_size"] = None  # no dense MLP is built
    if arch.is_moe:
        out.update(router_score_func="softmax", route_scale=1.0)
    else:
        out["num_experts"] = 0
        for k in ("num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"):
            out.pop(k, None)
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        if math.isnan(a) and math.isnan(float(b)):
            return True
        return math.isclose(a, float(b), rel_tol=1e-4, abs_tol=0.0)
    if isinstance(b, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
        return _same(b, a)
    return a == b


def settings_table(name_a: str, a: dict, name_b: str, b: dict) -> tuple[str, str | None]:
    """(side-by-side table of both models' settings, first differing canonical key or None).

    Floats compare with rel 1e-4 (theta recovered from a float32 buffer carries float32
    rounding); everything else exactly.
    """
    keys = [k for k in CANONICAL_KEYS if k in a or k in b]
    keys += sorted((set(a) | set(b)) - set(keys))
    first = None
    width = max(len(k) for k in keys) if keys else 10
    lines = [f"  {'setting':<{width}}  {name_a:<28}  {name_b:<28}"]
    for k in keys:
        va, vb = a.get(k, "-"), b.get(k, "-")
        differs = k in a and k in b and not _same(va, vb)
        if differs and first is None and k in CANONICAL_KEYS:
            first = k
        mark = "  <-- differs" if differs else ""
        lines.append(f"  {k:<{width}}  {_fmt(va):<28}  {_fmt(vb):<28}{mark}")
    if first:
        lines.append(f"  first differing setting: {first}")
    return "\n".join(lines), first


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)

"""transformers 5.x Qwen3 / Qwen3-MoE code under test.

rotary_embedding  Qwen3RotaryEmbedding (cos/sin, cast to x's dtype as HF does) +
                  qwen3 apply_rotary_pos_emb (unsqueeze_dim=2 for (B, S, H, D))
rms_norm          Qwen3RMSNorm
moe_router        Qwen3MoeTopKRouter (norm_topk_prob=True)
grouped_swiglu    Qwen3MoeExperts with experts_implementation "eager" and "grouped_mm"
                  (one routed expert per row, weight 1.0: exactly the expert MLP)
cross_entropy     transformers.loss.loss_utils.ForCausalLMLoss with ``shift_labels`` given
                  (labels already aligned) and num_items_in_batch=1 (a sum)
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from harness.kernels.checks.spec import torch_device


def _on(device: str):
    return torch_device(device)


def rotary_embedding(inputs, params, device):
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config  # noqa: PLC0415  optional: transformers may be absent (has_transformers); the registry loads without it
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb  # noqa: PLC0415  optional: transformers may be absent (has_transformers); the registry loads without it

    x, positions = inputs["x"], inputs["positions"]
    config = Qwen3Config(
        head_dim=x.shape[-1],
        rope_parameters={"rope_type": "default", "rope_theta": params["theta"]},
        max_position_embeddings=max(40960, int(positions.max()) + 1),
    )
    rotary = Qwen3RotaryEmbedding(config).to(_on(device))
    cos, sin = rotary(x, positions.expand(x.shape[0], -1))
    y, _ = apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=2)
    return {"y": y}


def rms_norm(inputs, params, device):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: PLC0415  optional: transformers may be absent (has_transformers); the registry loads without it

    x, weight = inputs["x"], inputs["weight"]
    module = Qwen3RMSNorm(x.shape[-1], eps=params["eps"]).to(device=_on(device), dtype=x.dtype)
    return {"y": functional_call(module, {"weight": weight}, (x,))}


def _moe_config(dim: int, experts: int, top_k: int, hidden: int = 8, impl: str | None = None):
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig  # noqa: PLC0415  optional: transformers may be absent (has_transformers); the registry loads without it

    config = Qwen3MoeConfig(
        hidden_size=dim, num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True,
        moe_intermediate_size=hidden,
    )
    if impl is not None:
        config._experts_implementation = impl
    return config


def moe_router(inputs, params, device):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter  # noqa: PLC0415  optional: transformers may be absent (has_transformers); the registry loads without it

    x, gate = inputs["x"], inputs["gate_weight"]
    module = Qwen3MoeTopKRouter(_moe_config(x.shape[-1], gate.shape[0], params["top_k"])).to(_on(device), x.dtype)
    _logits, weights, ids = functional_call(module, {"weight": gate}, (x,))
    return {"weights": weights, "ids": ids}


def router_output_dtypes(dtype, device):
    """HF returns the top-k weights in the router logits' dtype (the input dtype)."""
    return {"weights": dtype}


def _experts(impl: str):
    def run(inputs, params, device):
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts  # noqa: PLC0415  optional: transformers may be absent (has_transformers); the registry loads without it

        x, counts, w1, w2, w3 = (inputs[k] for k in ("x", "num_tokens_per_expert", "w1", "w2", "w3"))
        experts, hidden, dim = w1.shape
        module = Qwen3MoeExperts(_moe_config(dim, experts, 1, hidden=hidden, impl=impl)).to(_on(device), x.dtype)
        expert_of_row = torch.repeat_interleave(torch.arange(experts, device=x.device), counts.to(x.device))
        owned = expert_of_row.shape[0]
        top_k_index = expert_of_row[:, None]
        top_k_weights = torch.ones(owned, 1, dtype=x.dtype, device=x.device)
        params_ = {"gate_up_proj": torch.cat([w1, w3], dim=1), "down_proj": w2}
        y = functional_call(module, params_, (x[:owned], top_k_index, top_k_weights))
        return {"y": torch.cat([y, x[owned:] * 0], dim=0)}

    return run


grouped_swiglu_eager = _experts("eager")
grouped_swiglu_grouped_mm = _experts("grouped_mm")


def cross_entropy(inputs, params, device):
    from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: PLC0415  optional: transformers may be absent (has_transformers); the registry loads without it

    logits, labels = inputs["logits"], inputs["labels"]
    num_items = torch.tensor(1, device=logits.device)
    loss = ForCausalLMLoss(
        logits, None, vocab_size=logits.shape[-1], num_items_in_batch=num_items, shift_labels=labels
    )
    return {"loss": loss}

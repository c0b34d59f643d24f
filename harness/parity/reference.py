"""An independent Qwen3 / Qwen3-MoE forward pass in plain torch: the third voter.

When transformers and torchtitan disagree, this says which one moved. It reads the HF
checkpoint's tensors by their on-disk names and the architecture from ``config.json``
(:class:`~harness.hf_config.Qwen3Arch`), and shares no code with either library: the
math is written out from the Qwen3 model definition.

- embedding; per layer ``x += o(attn(rmsnorm(x)))``, ``x += mlp(rmsnorm(x))``; final
  RMSNorm; ``lm_head`` (the embedding matrix when ``tie_word_embeddings``).
- attention: q/k/v projections, per-head RMSNorm on q and k (before RoPE), rotate-half RoPE
  with ``inv_freq = theta ** (-2i/d)`` at the given positions, grouped-query attention
  (query head ``h`` reads kv head ``h // (n_heads / n_kv_heads)``), scale ``head_dim**-0.5``,
  same-document causal mask (a document starts where ``positions == 0``, torchtitan's
  convention for packed rows), fp32 softmax.
- RMSNorm: ``w * x / sqrt(mean(x**2) + eps)`` in fp32.
- dense MLP: ``down(silu(gate(x)) * up(x))``.
- MoE: fp32 router logits, fp32 softmax over experts, top-k, renormalised to sum 1 when
  ``norm_topk_prob``, weighted sum of the chosen experts' SwiGLU outputs. ``expert_dtype``
  bfloat16 emulates torchtitan's expert precision (operands cast to bf16, bf16 results) and
  its router's fp32 rounding (the top-k renormalised in ``topk(sorted=False)`` order, where
  transformers sums them by descending probability); without it the reference rounds as
  transformers does.

Every intermediate can be recorded (``record=``) under the canonical activation names of
:mod:`harness.parity.models`, for the layer-by-layer comparison.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from harness.hf_config import Qwen3Arch
from harness.ops import rope_torch as _rope


def load_hf_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in ``model_dir``, by key."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return tensors


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


# RoPE: the repository's one reference (harness/ops/rope_torch.py), in float32 here, where it
# is bitwise torchtitan's CosSinRoPE cache (the parity tolerances were measured that way).

def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return _rope.rope_inv_freq(head_dim, theta, dtype=torch.float32)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """cos, sin of shape [B, L, head_dim] (rotate-half layout: the half-angles repeated)."""
    return _rope.rope_cos_sin(positions, head_dim, theta, dtype=torch.float32)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, L, H, D]; cos/sin: [B, L, D]. Rotate-half convention."""
    return _rope.apply_rope(x, cos, sin)


def document_causal_mask(positions: torch.Tensor) -> torch.Tensor:
    """[B, 1, L, L] bool: key j visible to query i iff j <= i and both in the same document."""
    doc = torch.cumsum((positions == 0).int(), dim=1)
    same_doc = doc[:, :, None] == doc[:, None, :]
    length = positions.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return (same_doc & causal)[:, None]


def causal_mask(positions: torch.Tensor) -> torch.Tensor:
    length = positions.shape[1]
    return torch.ones(length, length, dtype=torch.bool).tril()[None, None].expand(
        positions.shape[0], 1, length, length
    )


def attention(x, w: dict, arch: Qwen3Arch, prefix: str, positions, mask, record, name):
    B, L, _ = x.shape
    H, KV, D = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    q = F.linear(x, w[f"{prefix}.q_proj.weight"]).view(B, L, H, D)
    k = F.linear(x, w[f"{prefix}.k_proj.weight"]).view(B, L, KV, D)
    v = F.linear(x, w[f"{prefix}.v_proj.weight"]).view(B, L, KV, D)
    q = rms_norm(q, w[f"{prefix}.q_norm.weight"], arch.rms_norm_eps)
    k = rms_norm(k, w[f"{prefix}.k_norm.weight"], arch.rms_norm_eps)
    cos, sin = rope_cos_sin(positions, D, arch.rope_theta)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    group = H // KV
    q = q.transpose(1, 2)  # B H L D
    k = k.transpose(1, 2).repeat_interleave(group, dim=1)
    v = v.transpose(1, 2).repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) * D**-0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1)
    out = (probs @ v).transpose(1, 2).reshape(B, L, H * D)
    out = F.linear(out, w[f"{prefix}.o_proj.weight"])
    if record is not None:
        record[name] = out
    return out


def swiglu(x, gate_w, up_w, down_w, dtype: torch.dtype | None = None):
    if dtype is None:
        return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)
    xd = x.to(dtype)
    h = F.silu(xd @ gate_w.to(dtype).T) * (xd @ up_w.to(dtype).T)
    return (h @ down_w.to(dtype).T).to(x.dtype)


def route(x_TD: torch.Tensor, gate_w: torch.Tensor, arch: Qwen3Arch, *, by_value: bool = True):
    """(weights [T, K], expert ids [T, K], probs [T, E]) exactly as Qwen3-MoE defines routing.

    ``by_value``: the k chosen experts in descending probability, as transformers orders them
    (``torch.topk`` sorted), so the renormalising fp32 sum adds them in that order. False keeps
    ``torch.topk(sorted=False)``'s order, in which torchtitan's router sums them. The set, and
    so the math, is the same; with k > 2 the fp32 sum's rounding depends on the order (1 ulp of
    a routing weight, which bf16 experts downstream enlarge to bf16 rounding flips)."""
    logits = F.linear(x_TD.float(), gate_w.float())
    probs = torch.softmax(logits, dim=-1)
    top_w, top_i = torch.topk(probs, arch.num_experts_per_tok, dim=-1, sorted=by_value)
    if arch.norm_topk_prob:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    return top_w, top_i, probs


def moe(x, w: dict, arch: Qwen3Arch, prefix: str, expert_dtype, record, name):
    B, L, Dm = x.shape
    x_TD = x.reshape(-1, Dm)
    # torchtitan's numerics (bf16 experts) include its top-k order for the renormalising sum.
    top_w, top_i, _ = route(x_TD, w[f"{prefix}.gate.weight"], arch, by_value=expert_dtype is None)
    out = torch.zeros_like(x_TD, dtype=torch.float32)
    for e in range(arch.num_experts):
        token, slot = torch.where(top_i == e)
        if token.numel() == 0:
            continue
        y = swiglu(
            x_TD[token],
            w[f"{prefix}.experts.{e}.gate_proj.weight"],
            w[f"{prefix}.experts.{e}.up_proj.weight"],
            w[f"{prefix}.experts.{e}.down_proj.weight"],
            expert_dtype,
        )
        out = out.index_add(0, token, y.float() * top_w[token, slot, None])
    out = out.to(x.dtype).view(B, L, Dm)
    if record is not None:
        record[name] = out
        record[f"{name}.router_top_ids"] = top_i
    return out


def forward(
    weights: dict[str, torch.Tensor],
    arch: Qwen3Arch,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    *,
    document_mask: bool = True,
    expert_dtype: torch.dtype | None = None,
    record: dict | None = None,
) -> torch.Tensor:
    """Logits [B, L, V] in fp32. ``weights`` are HF on-disk names (per-expert MoE keys)."""
    w = {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}
    mask = document_causal_mask(positions) if document_mask else causal_mask(positions)
    h = F.embedding(input_ids, w["model.embed_tokens.weight"])
    if record is not None:
        record["embed"] = h
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}"
        a = attention(rms_norm(h, w[f"{p}.input_layernorm.weight"], arch.rms_norm_eps), w, arch,
                      f"{p}.self_attn", positions, mask, record, f"layers.{i}.attn")
        h = h + a
        x = rms_norm(h, w[f"{p}.post_attention_layernorm.weight"], arch.rms_norm_eps)
        if arch.layer_is_moe(i):
            m = moe(x, w, arch, f"{p}.mlp", expert_dtype, record, f"layers.{i}.mlp")
        else:
            m = swiglu(x, w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"],
                       w[f"{p}.mlp.down_proj.weight"])
            if record is not None:
                record[f"layers.{i}.mlp"] = m
        h = h + m
        if record is not None:
            record[f"layers.{i}"] = h
    h = rms_norm(h, w["model.norm.weight"], arch.rms_norm_eps)
    if record is not None:
        record["norm"] = h
    head = w["model.embed_tokens.weight"] if arch.tie_word_embeddings else w["lm_head.weight"]
    logits = F.linear(h, head)
    if record is not None:
        record["logits"] = logits
    return logits

"""The independent reference, traced module by module, in float64, one layer in memory.

The same Qwen3 math as :mod:`harness.parity.reference` (whose RoPE, routing and SwiGLU
building blocks it reuses), written as a walk that records the output of every step under the
name of the torchtitan module that computes it, in forward order:

    tok_embeddings
    layers.{i}.attention_norm   layers.{i}.attention.qkv_linear  (q, k, v)
    layers.{i}.attention.q_norm layers.{i}.attention.k_norm
    layers.{i}.attention.rope   (q, k)
    layers.{i}.attention        layers.{i}.ffn_norm
    layers.{i}.moe.router       (expert ids, their weights)   layers.{i}.moe.routed_experts
    layers.{i}.moe | layers.{i}.feed_forward                  layers.{i}
    norm                        lm_head (logits)

Everything is float64 except what the model under test is defined to compute in lower
precision: the MoE router's softmax (float32, as Qwen3-MoE defines it) and, with
``expert_dtype=bfloat16``, the expert matmuls (torchtitan's ``GroupedExperts`` casts operands
to bf16). Weights are read per layer from the safetensors files (``WeightSource``), so the
reference never holds more than one layer of weights and the activations of one batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from safetensors import safe_open

from harness.hf_config import Qwen3Arch
from harness.ops import rope_torch
from harness.parity import reference

DTYPE = torch.float64


class WeightSource:
    """HF tensors by on-disk name, read on demand from a folder of safetensors, or from a dict
    (a rank dump of a random-init run's step-0 weights, already under HF names)."""

    def __init__(self, source: str | Path | dict[str, torch.Tensor]) -> None:
        self._dict = source if isinstance(source, dict) else None
        self._where: dict[str, Path] = {}
        if self._dict is None:
            files = sorted(Path(source).glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {source}: the diagnosis needs the "
                                        f"weights the run started from")
            for path in files:
                with safe_open(str(path), "pt") as f:
                    for key in f.keys():
                        self._where[key] = path

    def keys(self) -> set[str]:
        return set(self._dict) if self._dict is not None else set(self._where)

    def __getitem__(self, key: str) -> torch.Tensor:
        if self._dict is not None:
            return self._dict[key].to(DTYPE)
        with safe_open(str(self._where[key]), "pt") as f:
            return f.get_tensor(key).to(DTYPE)

    def prefixed(self, prefix: str) -> dict[str, torch.Tensor]:
        return {k: self[k] for k in sorted(self.keys()) if k.startswith(prefix)}


class Leaves:
    """A ``WeightSource`` whose tensors are float64 leaves that record their gradients: the
    reference side of the gradient comparison (each tensor read once, then the same leaf)."""

    def __init__(self, source: WeightSource) -> None:
        self.source = source
        self._leaves: dict[str, torch.Tensor] = {}

    def keys(self) -> set[str]:
        return self.source.keys()

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._leaves:
            self._leaves[key] = self.source[key].requires_grad_(True)
        return self._leaves[key]

    def prefixed(self, prefix: str) -> dict[str, torch.Tensor]:
        return {k: self[k] for k in sorted(self.keys()) if k.startswith(prefix)}

    def grads(self) -> dict[str, torch.Tensor]:
        return {k: t.grad for k, t in self._leaves.items() if t.grad is not None}


def trace_backward(loss: torch.Tensor) -> None:
    loss.backward()


# HF weight name (layer dropped) -> the trace module whose parameter it is
_WEIGHT_MODULE = {
    "input_layernorm": "attention_norm", "self_attn.q_proj": "attention.qkv_linear",
    "self_attn.k_proj": "attention.qkv_linear", "self_attn.v_proj": "attention.qkv_linear",
    "self_attn.q_norm": "attention.q_norm", "self_attn.k_norm": "attention.k_norm",
    "self_attn.o_proj": "attention", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "feed_forward", "mlp.up_proj": "feed_forward", "mlp.down_proj": "feed_forward",
    "mlp.gate": "moe.router", "mlp.experts": "moe.routed_experts",
}


def module_of_weight(key: str) -> str:
    """The trace module that holds HF weight ``key`` (``model.layers.1.self_attn.q_norm.weight``
    -> ``layers.1.attention.q_norm``); a tied embedding is ``tok_embeddings``'s."""
    if key.startswith("model.embed_tokens."):
        return "tok_embeddings"
    if key.startswith("model.norm."):
        return "norm"
    if key.startswith("lm_head."):
        return "lm_head"
    parts = key.split(".")
    if parts[:2] != ["model", "layers"]:
        raise KeyError(f"{key}: not a Qwen3 weight name")
    rest = ".".join(parts[3:])
    for theirs, ours in _WEIGHT_MODULE.items():
        if rest.startswith(theirs + "."):
            return f"layers.{parts[2]}.{ours}"
    raise KeyError(f"{key}: no trace module holds it")


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def trace(weights: WeightSource, arch: Qwen3Arch, input_ids: torch.Tensor,
          positions: torch.Tensor, *, expert_dtype: torch.dtype | None = None,
          mask: str = "document") -> Iterator[tuple[str, object]]:
    """Yield ``(module name, output)`` in forward order; a tuple output for modules that
    return several tensors (q/k/v, rope's q/k, the router's ids and weights). ``mask``:
    "document" (causal within each document; a document starts where ``positions == 0``) or
    "causal" (causal over the whole row, whatever the positions)."""
    B, L = input_ids.shape
    H, KV, D = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    eps = arch.rms_norm_eps
    mask = (reference.document_causal_mask(positions) if mask == "document"
            else reference.causal_mask(positions))
    cos, sin = rope_torch.rope_cos_sin(positions, D, arch.rope_theta, dtype=DTYPE)
    h = F.embedding(input_ids, weights["model.embed_tokens.weight"])
    yield "tok_embeddings", h
    for i in range(arch.num_hidden_layers):
        w = weights.prefixed(f"model.layers.{i}.")
        p = f"model.layers.{i}"
        a = f"layers.{i}.attention"
        x = _rms(h, w[f"{p}.input_layernorm.weight"], eps)
        yield f"layers.{i}.attention_norm", x
        q = F.linear(x, w[f"{p}.self_attn.q_proj.weight"]).view(B, L, H, D)
        k = F.linear(x, w[f"{p}.self_attn.k_proj.weight"]).view(B, L, KV, D)
        v = F.linear(x, w[f"{p}.self_attn.v_proj.weight"]).view(B, L, KV, D)
        yield f"{a}.qkv_linear", (q, k, v)
        q = _rms(q, w[f"{p}.self_attn.q_norm.weight"], eps)
        yield f"{a}.q_norm", q
        k = _rms(k, w[f"{p}.self_attn.k_norm.weight"], eps)
        yield f"{a}.k_norm", k
        q, k = rope_torch.apply_rope(q, cos, sin), rope_torch.apply_rope(k, cos, sin)
        yield f"{a}.rope", (q, k)
        group = H // KV
        qt = q.transpose(1, 2)
        kt = k.transpose(1, 2).repeat_interleave(group, dim=1)
        vt = v.transpose(1, 2).repeat_interleave(group, dim=1)
        scores = (qt @ kt.transpose(-1, -2)) * D**-0.5
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        out = F.linear((probs @ vt).transpose(1, 2).reshape(B, L, H * D),
                       w[f"{p}.self_attn.o_proj.weight"])
        yield a, out
        h = h + out
        x = _rms(h, w[f"{p}.post_attention_layernorm.weight"], eps)
        yield f"layers.{i}.ffn_norm", x
        if arch.layer_is_moe(i):
            m = yield from _moe(x, w, arch, p, f"layers.{i}.moe", expert_dtype)
        else:
            m = reference.swiglu(x, w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"],
                                 w[f"{p}.mlp.down_proj.weight"])
            yield f"layers.{i}.feed_forward", m
        h = h + m
        yield f"layers.{i}", h
        del w
    h = _rms(h, weights["model.norm.weight"], eps)
    yield "norm", h
    head = "model.embed_tokens.weight" if arch.tie_word_embeddings else "lm_head.weight"
    yield "lm_head", F.linear(h, weights[head])


def _moe(x, w, arch: Qwen3Arch, p: str, name: str, expert_dtype):
    B, L, Dm = x.shape
    x_TD = x.reshape(-1, Dm)
    top_w, top_i, _ = reference.route(x_TD, w[f"{p}.mlp.gate.weight"], arch)
    yield f"{name}.router", (top_i, top_w)
    out = torch.zeros_like(x_TD)
    for e in range(arch.num_experts):
        token, slot = torch.where(top_i == e)
        if token.numel() == 0:
            continue
        y = reference.swiglu(x_TD[token], w[f"{p}.mlp.experts.{e}.gate_proj.weight"],
                             w[f"{p}.mlp.experts.{e}.up_proj.weight"],
                             w[f"{p}.mlp.experts.{e}.down_proj.weight"], expert_dtype)
        out = out.index_add(0, token, y.to(DTYPE) * top_w[token, slot, None].to(DTYPE))
    out = out.view(B, L, Dm)
    yield f"{name}.routed_experts", out
    yield name, out
    return out


def trace_names(arch: Qwen3Arch) -> list[tuple[str, int | None]]:
    """Every (module name, layer) the trace yields, in its order, without computing it."""
    names: list[tuple[str, int | None]] = [("tok_embeddings", None)]
    for i in range(arch.num_hidden_layers):
        a = f"layers.{i}.attention"
        names += [(n, i) for n in (f"layers.{i}.attention_norm", f"{a}.qkv_linear", f"{a}.q_norm",
                                   f"{a}.k_norm", f"{a}.rope", a, f"layers.{i}.ffn_norm")]
        ffn = (f"layers.{i}.moe.router", f"layers.{i}.moe.routed_experts", f"layers.{i}.moe") \
            if arch.layer_is_moe(i) else (f"layers.{i}.feed_forward",)
        names += [(n, i) for n in (*ffn, f"layers.{i}")]
    return names + [("norm", None), ("lm_head", None)]

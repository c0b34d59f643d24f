"""The independent reference, module by module, in float64, one unit at a time.

The same Qwen3 math as :mod:`harness.parity.reference` (whose RoPE, routing and SwiGLU
building blocks it reuses), written per unit (the embedding, each decoder layer, the final
norm, the lm_head: the model under test's units, harness/unit_walk.py). ``Reference.unit``
computes one unit from its input and that unit's weights alone, and yields the output of
every step under the name of the torchtitan module that computes it, in forward order:

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
to bf16). Weights are read per unit from the safetensors files (``WeightSource``,
``unit_weight_names``), so the reference never holds more than one unit of weights; the walk
that drives it forward and back is harness/diagnosis/localize.py.
"""

from __future__ import annotations

import math
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

    def float64_bytes(self, key: str) -> int:
        """What tensor ``key`` takes in float64, from its shape alone (nothing is read)."""
        if self._dict is not None:
            return self._dict[key].numel() * DTYPE.itemsize
        with safe_open(str(self._where[key]), "pt") as f:
            return math.prod(f.get_slice(key).get_shape()) * DTYPE.itemsize


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


EMBED = "model.embed_tokens.weight"


def unit_names(arch: Qwen3Arch) -> list[str]:
    """The reference's units in forward order: what one step of the walk computes, with one
    unit's weights (the model under test's units: harness/unit_walk.py)."""
    return ["tok_embeddings", *(f"layers.{i}" for i in range(arch.num_hidden_layers)), "norm",
            "lm_head"]


def unit_of(name: str) -> str:
    """The unit a trace module belongs to (``layers.1.attention.q_norm`` -> ``layers.1``)."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "layers" else parts[0]


def unit_weight_names(arch: Qwen3Arch, unit: str, keys: set[str]) -> list[str]:
    """The HF tensors (of ``keys``, a checkpoint's names) that ``unit`` reads; a tied lm_head
    reads the embedding."""
    if unit == "tok_embeddings":
        return [EMBED]
    if unit == "norm":
        return ["model.norm.weight"]
    if unit == "lm_head":
        return [EMBED if arch.tie_word_embeddings else "lm_head.weight"]
    prefix = f"model.{unit}."
    return sorted(k for k in keys if k.startswith(prefix))


class Reference:
    """The float64 reference on one batch (``input_ids``, ``positions``, ``mask``), one unit at
    a time: ``unit(name, w, x)`` yields ``(module name, output)`` in forward order for the
    unit's modules, from the unit's input ``x`` (the token ids for ``tok_embeddings``) and its
    weights ``w`` (HF names: ``unit_weight_names``); the last output is the unit's. A tuple
    output for modules that return several tensors (q/k/v, rope's q/k, the router's ids and
    weights). ``mask``: "document" (causal within each document; a document starts where
    ``positions == 0``) or "causal" (causal over the whole row, whatever the positions)."""

    def __init__(self, arch: Qwen3Arch, input_ids: torch.Tensor, positions: torch.Tensor, *,
                 expert_dtype: torch.dtype | None = None, mask: str = "document") -> None:
        self.arch, self.input_ids, self.expert_dtype = arch, input_ids, expert_dtype
        self.mask = (reference.document_causal_mask(positions) if mask == "document"
                     else reference.causal_mask(positions))
        self.cos, self.sin = rope_torch.rope_cos_sin(positions, arch.head_dim, arch.rope_theta,
                                                     dtype=DTYPE)

    def tensors(self) -> list[torch.Tensor]:
        """What it holds for the whole walk: the batch's mask and RoPE tables."""
        return [self.mask, self.cos, self.sin]

    def unit(self, name: str, w: dict[str, torch.Tensor], x: torch.Tensor) -> Iterator[tuple[str, object]]:
        if name == "tok_embeddings":
            yield name, F.embedding(x, w[EMBED])
        elif name.startswith("layers."):
            yield from self._layer(int(name.split(".")[1]), w, x)
        elif name == "norm":
            yield name, _rms(x, w["model.norm.weight"], self.arch.rms_norm_eps)
        elif name == "lm_head":
            yield name, F.linear(x, w[EMBED if self.arch.tie_word_embeddings else "lm_head.weight"])
        else:
            raise KeyError(f"{name}: not a reference unit (known: {unit_names(self.arch)})")

    def _layer(self, i: int, w: dict[str, torch.Tensor], h: torch.Tensor):
        arch = self.arch
        B, L, _ = h.shape
        H, KV, D = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
        eps = arch.rms_norm_eps
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
        q, k = rope_torch.apply_rope(q, self.cos, self.sin), rope_torch.apply_rope(k, self.cos, self.sin)
        yield f"{a}.rope", (q, k)
        group = H // KV
        qt = q.transpose(1, 2)
        kt = k.transpose(1, 2).repeat_interleave(group, dim=1)
        vt = v.transpose(1, 2).repeat_interleave(group, dim=1)
        scores = (qt @ kt.transpose(-1, -2)) * D**-0.5
        probs = torch.softmax(scores.masked_fill(~self.mask, float("-inf")), dim=-1)
        out = F.linear((probs @ vt).transpose(1, 2).reshape(B, L, H * D),
                       w[f"{p}.self_attn.o_proj.weight"])
        yield a, out
        h = h + out
        x = _rms(h, w[f"{p}.post_attention_layernorm.weight"], eps)
        yield f"layers.{i}.ffn_norm", x
        if arch.layer_is_moe(i):
            m = yield from _moe(x, w, arch, p, f"layers.{i}.moe", self.expert_dtype)
        else:
            m = reference.swiglu(x, w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"],
                                 w[f"{p}.mlp.down_proj.weight"])
            yield f"layers.{i}.feed_forward", m
        yield f"layers.{i}", h + m


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

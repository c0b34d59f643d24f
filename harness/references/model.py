"""The independent Qwen3 / Qwen3-MoE forward pass in plain torch: the one model reference, in
the precision it is asked for, whole (``forward``) or one unit at a time (``Reference.unit``).

When transformers and torchtitan disagree, it says which one moved (the parity suite's third
voter, in float32), and where a run parts from the truth, it says at which module (the
diagnosis, in float64: harness/diagnosis/localize.py). It reads the HF checkpoint's tensors by
their on-disk names and the architecture from ``config.json`` (:class:`~harness.registry.hf_config.
Qwen3Arch`), and shares no code with either library: the math is written out from the Qwen3
model definition, built from the per-op references beside the kernels (harness/kernels/ops/
rms_norm_torch.py, rope_torch.py, moe_router_torch.py, grouped_swiglu_torch.py ``swiglu``).

- embedding; per layer ``x += o(attn(rmsnorm(x)))``, ``x += mlp(rmsnorm(x))``; final
  RMSNorm; ``lm_head`` (the embedding matrix when ``tie_word_embeddings``).
- attention: q/k/v projections, per-head RMSNorm on q and k (before RoPE), rotate-half RoPE
  with ``inv_freq = theta ** (-2i/d)`` at the given positions, grouped-query attention
  (query head ``h`` reads kv head ``h // (n_heads / n_kv_heads)``), scale ``head_dim**-0.5``,
  ``mask``: "document" (causal within each document; a document starts where ``positions ==
  0``, torchtitan's convention for packed rows) or "causal" (over the whole row).
- dense MLP: ``down(silu(gate(x)) * up(x))``.
- MoE: router logits and softmax over the experts in float32 (as Qwen3-MoE defines them),
  top-k, renormalised to sum 1 when ``norm_topk_prob``, the weighted sum of the chosen experts'
  SwiGLU outputs.

Precision is a parameter, ``dtype``: every step computes in it (float32 for the parity
comparison, whose tolerances were measured with this float32 reference; float64 for the
diagnosis' truth), except what the model defines in lower precision: the router (float32) and,
with ``expert_dtype=bfloat16``, the expert matmuls (torchtitan's ``GroupedExperts`` casts its
operands to bf16), together with its router's top-k order for the renormalising sum
(``topk(sorted=False)``, where transformers sums by descending probability); without it the
reference rounds as transformers does.

The units are the model under test's (harness/model/unit_walk.py): ``tok_embeddings``, each
``layers.{i}``, ``norm``, ``lm_head``. ``Reference.unit`` computes one from its input and that
unit's weights alone, and yields the output of every step under the name of the torchtitan
module that computes it, in forward order (``trace_names``)::

    tok_embeddings
    layers.{i}.attention_norm   layers.{i}.attention.qkv_linear  (q, k, v)
    layers.{i}.attention.q_norm layers.{i}.attention.k_norm
    layers.{i}.attention.rope   (q, k)
    layers.{i}.attention        layers.{i}.ffn_norm
    layers.{i}.moe.router       (expert ids, their weights)   layers.{i}.moe.routed_experts
    layers.{i}.moe | layers.{i}.feed_forward                  layers.{i}
    norm                        lm_head (logits)

``forward`` runs them all and can record the intermediates (``record=``) under the canonical
activation names of :mod:`harness.parity.models`, for the layer-by-layer comparison. Weights
come by HF name, all at once (``load_hf_tensors``) or read per unit on demand (``WeightSource``,
``unit_weight_names``), so a walk never holds more than one unit of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from harness.kernels.ops.grouped_swiglu_torch import swiglu
from harness.kernels.ops.moe_router_torch import route as top_k_route
from harness.kernels.ops.rms_norm_torch import rms_norm
from harness.kernels.ops.rope_torch import apply_rope, rope_cos_sin
from harness.registry.hf_config import Qwen3Arch

EMBED = "model.embed_tokens.weight"
# A step of the reference -> the canonical activation name the parity models record it under.
_PARITY_NAMES = {"tok_embeddings": "embed", "norm": "norm", "lm_head": "logits", "attention": "attn",
                 "feed_forward": "mlp", "moe": "mlp", "moe.router": "mlp.router_top_ids"}


# ------------------------------------------------------------------ the weights, by HF name

def load_hf_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in ``model_dir``, by key."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return tensors


class WeightSource:
    """HF tensors by on-disk name in ``dtype``, read on demand from a folder of safetensors, or
    from a dict (a rank dump of a random-init run's step-0 weights, already under HF names)."""

    def __init__(self, source: str | Path | dict[str, torch.Tensor], dtype: torch.dtype = torch.float64) -> None:
        self.dtype = dtype
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
            return self._dict[key].to(self.dtype)
        with safe_open(str(self._where[key]), "pt") as f:
            return f.get_tensor(key).to(self.dtype)

    def float64_bytes(self, key: str) -> int:
        """What tensor ``key`` takes in float64, from its shape alone (nothing is read)."""
        if self._dict is not None:
            return self._dict[key].numel() * torch.float64.itemsize
        with safe_open(str(self._where[key]), "pt") as f:
            return math.prod(f.get_slice(key).get_shape()) * torch.float64.itemsize


# ------------------------------------------------------------------ units and their steps

def unit_names(arch: Qwen3Arch) -> list[str]:
    """The reference's units in forward order: what one step of a walk computes, with one
    unit's weights (the model under test's units: harness/model/unit_walk.py)."""
    return ["tok_embeddings", *(f"layers.{i}" for i in range(arch.num_hidden_layers)), "norm",
            "lm_head"]


def unit_of(name: str) -> str:
    """The unit a step belongs to (``layers.1.attention.q_norm`` -> ``layers.1``)."""
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


def trace_names(arch: Qwen3Arch) -> list[tuple[str, int | None]]:
    """Every (step name, layer) the units yield, in their order, without computing them."""
    names: list[tuple[str, int | None]] = [("tok_embeddings", None)]
    for i in range(arch.num_hidden_layers):
        a = f"layers.{i}.attention"
        names += [(n, i) for n in (f"layers.{i}.attention_norm", f"{a}.qkv_linear", f"{a}.q_norm",
                                   f"{a}.k_norm", f"{a}.rope", a, f"layers.{i}.ffn_norm")]
        ffn = (f"layers.{i}.moe.router", f"layers.{i}.moe.routed_experts", f"layers.{i}.moe") \
            if arch.layer_is_moe(i) else (f"layers.{i}.feed_forward",)
        names += [(n, i) for n in (*ffn, f"layers.{i}")]
    return names + [("norm", None), ("lm_head", None)]


# ------------------------------------------------------------------ the math

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


def route(x_TD: torch.Tensor, gate_w: torch.Tensor, arch: Qwen3Arch, *, by_value: bool = True):
    """(weights [T, K], expert ids [T, K], probs [T, E]) exactly as Qwen3-MoE defines routing:
    in float32, the arch's k, renormalised with ``norm_topk_prob``. ``by_value``: the chosen
    experts in descending probability (transformers' order for the renormalising sum); False:
    ``topk(sorted=False)``'s (torchtitan's) (harness/kernels/ops/moe_router_torch.py)."""
    return top_k_route(x_TD.float(), gate_w.float(), arch.num_experts_per_tok,
                       renormalise=arch.norm_topk_prob, by_value=by_value)


def moe(x: torch.Tensor, w: dict, arch: Qwen3Arch, prefix: str, *,
        expert_dtype: torch.dtype | None = None):
    """(output in ``x``'s dtype and shape, expert ids [T, K], their weights [T, K]) of the MoE
    block ``prefix`` (``model.layers.{i}.mlp``) on ``x`` [..., D]: each token's chosen experts'
    SwiGLU outputs (matmuls in ``expert_dtype`` if given), weighted and summed in ``x``'s dtype.
    With ``expert_dtype``, the router's top-k order is torchtitan's (its numerics include it)."""
    x_TD = x.reshape(-1, x.shape[-1])
    weights, ids, _ = route(x_TD, w[f"{prefix}.gate.weight"], arch, by_value=expert_dtype is None)
    out = torch.zeros_like(x_TD)
    for e in range(arch.num_experts):
        token, slot = torch.where(ids == e)
        if token.numel() == 0:
            continue
        expert = f"{prefix}.experts.{e}"
        y = swiglu(x_TD[token], w[f"{expert}.gate_proj.weight"], w[f"{expert}.up_proj.weight"],
                   w[f"{expert}.down_proj.weight"], dtype=expert_dtype)
        out = out.index_add(0, token, y.to(x.dtype) * weights[token, slot, None].to(x.dtype))
    return out.view(x.shape), ids, weights


class Reference:
    """The reference on one batch (``input_ids``, ``positions``), one unit at a time, in
    ``dtype``: ``unit(name, w, x)`` yields ``(step name, output)`` in forward order for the
    unit's steps, from the unit's input ``x`` (the token ids for ``tok_embeddings``) and its
    weights ``w`` (HF names, in ``dtype``: ``unit_weight_names``); the last output is the
    unit's. A tuple output for steps that return several tensors (q/k/v, rope's q/k, the
    router's ids and weights). ``mask``: "document" or "causal" (module docstring)."""

    def __init__(self, arch: Qwen3Arch, input_ids: torch.Tensor, positions: torch.Tensor, *,
                 dtype: torch.dtype = torch.float64, expert_dtype: torch.dtype | None = None,
                 mask: str = "document") -> None:
        if mask not in ("document", "causal"):
            raise ValueError(f"unknown mask {mask!r}: 'document' or 'causal'")
        self.arch, self.input_ids, self.expert_dtype = arch, input_ids, expert_dtype
        self.mask = document_causal_mask(positions) if mask == "document" else causal_mask(positions)
        self.cos, self.sin = rope_cos_sin(positions, arch.head_dim, arch.rope_theta, dtype=dtype)

    def tensors(self) -> list[torch.Tensor]:
        """What it holds for the whole walk: the batch's mask and RoPE tables."""
        return [self.mask, self.cos, self.sin]

    def unit(self, name: str, w: dict[str, torch.Tensor], x: torch.Tensor) -> Iterator[tuple[str, object]]:
        if name == "tok_embeddings":
            yield name, F.embedding(x, w[EMBED])
        elif name.startswith("layers."):
            yield from self._layer(int(name.split(".")[1]), w, x)
        elif name == "norm":
            yield name, rms_norm(x, w["model.norm.weight"], self.arch.rms_norm_eps)
        elif name == "lm_head":
            yield name, F.linear(x, w[EMBED if self.arch.tie_word_embeddings else "lm_head.weight"])
        else:
            raise KeyError(f"{name}: not a reference unit (known: {unit_names(self.arch)})")

    def _layer(self, i: int, w: dict[str, torch.Tensor], h: torch.Tensor):
        p, eps = f"model.layers.{i}", self.arch.rms_norm_eps
        x = rms_norm(h, w[f"{p}.input_layernorm.weight"], eps)
        yield f"layers.{i}.attention_norm", x
        out = yield from self._attention(f"layers.{i}.attention", w, f"{p}.self_attn", x)
        h = h + out
        x = rms_norm(h, w[f"{p}.post_attention_layernorm.weight"], eps)
        yield f"layers.{i}.ffn_norm", x
        if self.arch.layer_is_moe(i):
            m, ids, weights = moe(x, w, self.arch, f"{p}.mlp", expert_dtype=self.expert_dtype)
            yield f"layers.{i}.moe.router", (ids, weights)
            yield f"layers.{i}.moe.routed_experts", m
            yield f"layers.{i}.moe", m
        else:
            m = swiglu(x, w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"],
                       w[f"{p}.mlp.down_proj.weight"])
            yield f"layers.{i}.feed_forward", m
        yield f"layers.{i}", h + m

    def _attention(self, a: str, w: dict[str, torch.Tensor], p: str, x: torch.Tensor):
        arch = self.arch
        B, L, _ = x.shape
        H, KV, D = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
        q = F.linear(x, w[f"{p}.q_proj.weight"]).view(B, L, H, D)
        k = F.linear(x, w[f"{p}.k_proj.weight"]).view(B, L, KV, D)
        v = F.linear(x, w[f"{p}.v_proj.weight"]).view(B, L, KV, D)
        yield f"{a}.qkv_linear", (q, k, v)
        q = rms_norm(q, w[f"{p}.q_norm.weight"], arch.rms_norm_eps)
        yield f"{a}.q_norm", q
        k = rms_norm(k, w[f"{p}.k_norm.weight"], arch.rms_norm_eps)
        yield f"{a}.k_norm", k
        q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        yield f"{a}.rope", (q, k)
        group = H // KV
        qt = q.transpose(1, 2)  # B H L D
        kt = k.transpose(1, 2).repeat_interleave(group, dim=1)
        vt = v.transpose(1, 2).repeat_interleave(group, dim=1)
        scores = (qt @ kt.transpose(-1, -2)) * D**-0.5
        probs = torch.softmax(scores.masked_fill(~self.mask, float("-inf")), dim=-1)
        out = F.linear((probs @ vt).transpose(1, 2).reshape(B, L, H * D), w[f"{p}.o_proj.weight"])
        yield a, out
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
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Logits [B, L, V] in ``dtype``, every unit in turn. ``weights`` are HF on-disk names
    (per-expert MoE keys); ``record`` gets the parity models' canonical activations."""
    w = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
    reference = Reference(arch, input_ids, positions, dtype=dtype, expert_dtype=expert_dtype,
                          mask="document" if document_mask else "causal")
    x = input_ids
    for unit in unit_names(arch):
        for name, output in reference.unit(unit, w, x):
            canonical = parity_name(name)
            if record is not None and canonical is not None:
                record[canonical] = output[0] if name.endswith(".moe.router") else output
        x = output
    return x


def parity_name(name: str) -> str | None:
    """The canonical activation name (harness/parity/models.py) of step ``name``; None for the
    steps inside a module the parity models do not record."""
    parts = name.split(".")
    if parts[0] != "layers":
        return _PARITY_NAMES.get(name)
    layer, step = ".".join(parts[:2]), ".".join(parts[2:])
    if not step:
        return layer
    return f"{layer}.{_PARITY_NAMES[step]}" if step in _PARITY_NAMES else None

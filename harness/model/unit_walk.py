"""A model built on the meta device, walked one unit at a time: the one home of the unit walk.

A unit is what can be materialised, used and freed on its own: the embedding, each decoder
layer, the final norm, the lm_head (and, for transformers' Qwen3, its rotary embedding, which
has no parameters). ``model_units`` lists them in forward order for torchtitan's native Decoder
(``kind="native"``) and for torchtitan's transformers backend (``kind="hf"``), and fails loudly
when the model's children are not the ones it knows (an upstream change must be read, not
guessed at). ``run_layer`` calls one decoder layer as the model's own forward calls it.

Used by harness/checks/random_init_forward.py (stream-initialised full-size forward) and
harness/diagnosis/streamed.py (the diagnosis's model under test, one unit in memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

NATIVE_CHILDREN = ["tok_embeddings", "layers", "norm", "lm_head"]
HF_CHILDREN = ["embed_tokens", "layers", "norm", "rotary_emb"]


@dataclass
class Units:
    units: list[tuple[str, nn.Module]]  # every unit, forward order
    layers: list[tuple[str, nn.Module]]  # the decoder layers among them, in order
    tied: bool  # the embedding and lm_head share one weight

    @property
    def module(self) -> dict[str, nn.Module]:
        return dict(self.units)


def model_units(model: nn.Module, kind: str) -> Units:
    """The units of ``model`` (torchtitan's native Decoder, or HFTransformerModel) in forward order."""
    if kind == "native":
        children = [n for n, _ in model.named_children()]
        if children != NATIVE_CHILDREN:
            raise AssertionError(f"native Decoder children changed: {children} (known: "
                                 f"{NATIVE_CHILDREN}); update harness/model/unit_walk.py")
        layers = [(f"layers.{k}", m) for k, m in model.layers.items()]
        return Units([("tok_embeddings", model.tok_embeddings), *layers, ("norm", model.norm),
                      ("lm_head", model.lm_head)], layers, bool(model.enable_weight_tying))
    if kind == "hf":
        hf = model.model  # Qwen3ForCausalLM inside HFTransformerModel
        inner = hf.model
        children = [n for n, _ in inner.named_children()]
        if children != HF_CHILDREN:
            raise AssertionError(f"HF Qwen3Model children changed: {children} (known: "
                                 f"{HF_CHILDREN}); update harness/model/unit_walk.py")
        layers = [(f"layers.{k}", inner.layers[k]) for k in sorted(inner.layers.keys(), key=int)]
        return Units([("embed_tokens", inner.embed_tokens), *layers, ("norm", inner.norm),
                      ("rotary_emb", inner.rotary_emb), ("lm_head", hf.lm_head)], layers,
                     bool(hf.config.tie_word_embeddings))
    raise ValueError(f"unknown model kind {kind!r} (known: native, hf)")


def materialise(unit: nn.Module, device: str = "cpu") -> None:
    """The unit's parameters and buffers allocated (uninitialised) on ``device``."""
    unit.to_empty(device=device)


def free(unit: nn.Module) -> None:
    """The unit back on the meta device: its memory is released."""
    unit.to(device="meta")


def live_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters that are not on the meta device (a shared one once)."""
    seen, total = set(), 0
    for _, p in model.named_parameters(remove_duplicate=False):
        if p.device.type != "meta" and id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def parameter_bytes(unit: nn.Module) -> int:
    """Bytes the unit's parameters take when materialised (meta or not)."""
    return sum(p.numel() * p.element_size() for p in unit.parameters())


def run_layer(kind: str, layer: nn.Module, h: torch.Tensor, masks, positions,
              position_embeddings=None) -> torch.Tensor:
    """One decoder layer, called as the model's own forward calls it: torchtitan's Decoder
    ``layer(h, attention_masks, positions)`` (both generations); transformers' Qwen3Model
    ``layer(h, attention_mask=..., position_embeddings=..., position_ids=...)``."""
    if kind == "native":
        return layer(h, masks, positions)
    out = layer(h, attention_mask=masks, position_embeddings=position_embeddings,
                position_ids=positions)
    return out[0] if isinstance(out, tuple) else out

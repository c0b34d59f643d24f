"""The one reader of an HF ``config.json`` (Qwen3 / Qwen3-MoE), without transformers.

Both spellings transformers uses are accepted (4.x ``rope_theta`` / ``num_experts``; 5.x
``rope_parameters.rope_theta`` / ``num_local_experts``), so the backends' config builders,
the expectations, the reference model and the config-conformance check read every config the
same way, and none depends on the code under test to interpret the config it is checking.

- :func:`read_config_json` -- the raw dict (an error naming the directory and the fix).
- :func:`rope_theta`, :func:`num_experts`, :func:`is_moe` -- the fields spelled two ways.
- :func:`normalized_hf_dict` -- the raw dict with ``num_experts`` also set (4.x spelling).
- :class:`Qwen3Arch` -- the whole architecture, typed (``from_dir``, ``from_hf_dict``,
  :func:`arch_from_config_object` for a live transformers config).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


def _first(d: dict, *keys, default=None):
    for key in keys:
        if d.get(key) is not None:
            return d[key]
    return default


@dataclass(frozen=True)
class Qwen3Arch:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str
    attention_bias: bool
    # MoE (num_experts == 0: dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = field(default_factory=tuple)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_moe(self, layer: int) -> bool:
        return (
            self.is_moe
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_hf_dict(cls, hf: dict) -> Qwen3Arch:
        n_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        theta = rope_theta(hf)
        experts = num_experts(hf)
        return cls(
            model_type=str(hf.get("model_type", "")),
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=n_heads,
            num_key_value_heads=int(_first(hf, "num_key_value_heads", default=n_heads)),
            head_dim=int(_first(hf, "head_dim", default=hidden // n_heads)),
            intermediate_size=int(hf.get("intermediate_size") or 0),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_type=str(_first(rope, "rope_type", "type", default="default")),
            max_position_embeddings=int(hf.get("max_position_embeddings", 0)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            hidden_act=str(hf.get("hidden_act", "silu")),
            attention_bias=bool(hf.get("attention_bias", False)),
            num_experts=experts,
            num_experts_per_tok=int(hf.get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate_size=int(hf.get("moe_intermediate_size") or 0) if experts else 0,
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)) if experts else False,
            decoder_sparse_step=int(hf.get("decoder_sparse_step") or 1),
            mlp_only_layers=tuple(int(i) for i in (hf.get("mlp_only_layers") or ())),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Qwen3Arch:
        return cls.from_hf_dict(read_config_json(model_dir))


_CONFIG_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
                "rope_parameters", "rope_scaling", "rope_theta", "max_position_embeddings",
                "tie_word_embeddings", "hidden_act", "attention_bias", "num_experts",
                "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")


def arch_from_config_object(config) -> Qwen3Arch:
    """From a live transformers config object (attribute access, aliases resolved)."""
    return Qwen3Arch.from_hf_dict({k: getattr(config, k, None) for k in _CONFIG_KEYS})


def read_config_json(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no config.json in {model_dir}: an HF model dir needs one "
            f"(regenerate fixtures with `python scripts/make_fixtures.py`)")
    return json.loads(path.read_text())


def rope_theta(hf: dict) -> float:
    """rope theta from a transformers 4.x (``rope_theta``) or 5.x (``rope_parameters``) config."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = _first(rope, "rope_theta", default=hf.get("rope_theta"))
    if theta is None:
        raise KeyError("config.json has neither rope_parameters.rope_theta nor rope_theta")
    return float(theta)


def num_experts(hf: dict) -> int:
    """Routed experts per MoE layer; 0 for a dense model.

    transformers 4.x configs say ``num_experts``; transformers 5.x's ``save_pretrained`` writes
    ``num_local_experts`` (Qwen3MoeConfig maps one to the other).
    """
    count = int(_first(hf, "num_experts", "num_local_experts", default=0) or 0)
    if count == 0 and hf.get("model_type") == "qwen3_moe":
        raise ValueError("a qwen3_moe config.json without num_experts/num_local_experts")
    return count


def is_moe(hf: dict) -> bool:
    return num_experts(hf) > 0


def normalized_hf_dict(model_dir: str | Path) -> dict:
    """config.json with the MoE expert count also under ``num_experts`` (4.x spelling).

    transformers 5.x writes ``num_local_experts``; code that only reads ``num_experts`` would
    build a dense model from an MoE checkpoint.
    """
    hf = dict(read_config_json(model_dir))
    if hf.get("num_experts") is None and hf.get("num_local_experts") is not None:
        hf["num_experts"] = hf["num_local_experts"]
    return hf

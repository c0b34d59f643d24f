"""The one HF <-> native Qwen3 name table, and a model's state under torchtitan's names as the
HF checkpoint of its config, written by the harness (not torchtitan's state-dict adapter, which
is under test and on spring-2026 drops the MoE experts: known issue
spring2026-qwen3-moe-adapter-expert-keys).

The names are Qwen3's HF on-disk layout (``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM``,
``save_pretrained``; harness/parity/conformance/checkpoint.py ``expected_hf_checkpoint`` is that
layout for a config, and ``hf_state_from_native``'s result is checked against it key for key and
shape for shape). Each row of ``NAME_TABLE`` also names the reference step whose computation
reads the tensor (harness/references/model.py ``trace_names``: torchtitan's module names), which
``module_of_weight`` answers for an HF name (the diagnosis: which module a gradient belongs to):

| torchtitan (native Qwen3, both generations)            | HF                                        | reference step |
|---------------------------------------------------------|-------------------------------------------|----------------|
| ``tok_embeddings.weight``                               | ``model.embed_tokens.weight``             | ``tok_embeddings`` |
| ``layers.L.attention.[qkv_linear.]w{q,k,v}.weight``    | ``model.layers.L.self_attn.{q,k,v}_proj.weight`` | ``attention.qkv_linear`` |
| ``layers.L.attention.wo.weight``                        | ``model.layers.L.self_attn.o_proj.weight`` | ``attention`` |
| ``layers.L.attention.{q,k}_norm.weight``                | ``model.layers.L.self_attn.{q,k}_norm.weight`` | ``attention.{q,k}_norm`` |
| ``layers.L.attention_norm.weight`` / ``ffn_norm``       | ``model.layers.L.input_layernorm`` / ``post_attention_layernorm`` | the same |
| ``layers.L.feed_forward.w{1,3,2}.weight``               | ``model.layers.L.mlp.{gate,up,down}_proj.weight`` | ``feed_forward`` |
| ``layers.L.moe.router.gate.weight``                     | ``model.layers.L.mlp.gate.weight``        | ``moe.router`` |
| ``layers.L.moe.<experts>.w1_EFD`` [E, F, D]             | ``model.layers.L.mlp.experts.e.gate_proj.weight`` = [e] | ``moe.routed_experts`` |
| ``layers.L.moe.<experts>.w3_EFD`` [E, F, D]             | ``... experts.e.up_proj.weight`` = [e]    | ``moe.routed_experts`` |
| ``layers.L.moe.<experts>.w2_EDF`` [E, D, F]             | ``... experts.e.down_proj.weight`` = [e]  | ``moe.routed_experts`` |
| ``layers.L.moe.expert_bias_E``, ``tokens_per_expert_E`` | none: load-balancing state, must be zero (a step-0 state) | |
| ``norm.weight``                                         | ``model.norm.weight``                     | ``norm`` |
| ``lm_head.weight``                                      | ``lm_head.weight`` (absent when tied: it must equal the embedding) | ``lm_head`` |

``<experts>`` is ``experts`` (spring-2026) or ``routed_experts.inner_experts`` (0.3.0); the
transformers backend's state (``model.`` + HF names, harness/backends/hf_v5.py) loses its
wrapper prefix. A name outside this table is an error naming it: nothing is dropped silently.
"""  # noqa: E501  the name table above is one row a line, wider than the limit

from __future__ import annotations

import re
from pathlib import Path

import torch

from harness.parity.conformance.checkpoint import expected_hf_checkpoint
from harness.registry.hf_config import Qwen3Arch

_LAYER = r"layers\.(\d+)\."
_EXPERTS = _LAYER + r"moe\.(?:routed_experts\.inner_experts|experts)\."
# (torchtitan's name: a pattern, HF's: {0} the layer, {e} the expert, the reference step)
NAME_TABLE = [
    (r"tok_embeddings\.weight", "model.embed_tokens.weight", "tok_embeddings"),
    (r"norm\.weight", "model.norm.weight", "norm"),
    (r"lm_head\.weight", "lm_head.weight", "lm_head"),
    (_LAYER + r"attention\.(?:qkv_linear\.)?wq\.weight", "model.layers.{0}.self_attn.q_proj.weight",
     "attention.qkv_linear"),
    (_LAYER + r"attention\.(?:qkv_linear\.)?wk\.weight", "model.layers.{0}.self_attn.k_proj.weight",
     "attention.qkv_linear"),
    (_LAYER + r"attention\.(?:qkv_linear\.)?wv\.weight", "model.layers.{0}.self_attn.v_proj.weight",
     "attention.qkv_linear"),
    (_LAYER + r"attention\.wo\.weight", "model.layers.{0}.self_attn.o_proj.weight", "attention"),
    (_LAYER + r"attention\.q_norm\.weight", "model.layers.{0}.self_attn.q_norm.weight", "attention.q_norm"),
    (_LAYER + r"attention\.k_norm\.weight", "model.layers.{0}.self_attn.k_norm.weight", "attention.k_norm"),
    (_LAYER + r"attention_norm\.weight", "model.layers.{0}.input_layernorm.weight", "attention_norm"),
    (_LAYER + r"ffn_norm\.weight", "model.layers.{0}.post_attention_layernorm.weight", "ffn_norm"),
    (_LAYER + r"feed_forward\.w1\.weight", "model.layers.{0}.mlp.gate_proj.weight", "feed_forward"),
    (_LAYER + r"feed_forward\.w3\.weight", "model.layers.{0}.mlp.up_proj.weight", "feed_forward"),
    (_LAYER + r"feed_forward\.w2\.weight", "model.layers.{0}.mlp.down_proj.weight", "feed_forward"),
    (_LAYER + r"moe\.router\.gate\.weight", "model.layers.{0}.mlp.gate.weight", "moe.router"),
    # stacked experts [E, ...]: expert e's HF tensor is slice e (F = moe_intermediate, D = hidden)
    (_EXPERTS + r"w1(?:_EFD)?", "model.layers.{0}.mlp.experts.{e}.gate_proj.weight", "moe.routed_experts"),
    (_EXPERTS + r"w3(?:_EFD)?", "model.layers.{0}.mlp.experts.{e}.up_proj.weight", "moe.routed_experts"),
    (_EXPERTS + r"w2(?:_EDF)?", "model.layers.{0}.mlp.experts.{e}.down_proj.weight", "moe.routed_experts"),
]
# Load-balancing state with no HF counterpart: zero before the first optimizer step.
_STEP0_STATE = _LAYER + r"moe\.(expert_bias_E|expert_bias|tokens_per_expert_E|tokens_per_expert)"
_HF_BACKEND_PREFIX = "model."  # torchtitan's HFTransformerModel holds the HF model as .model


def _hf_module_pattern(hf: str) -> str:
    """The HF module of a table row as a pattern for its tensors' names (the layer captured):
    ``model.layers.(\\d+).self_attn.q_proj\\..+``; the experts' container for the experts, so a
    fused layout's names (``mlp.experts.gate_up_proj``) belong to it as well."""
    module = hf.split(".{e}.")[0] if "{e}" in hf else hf.rsplit(".", 1)[0]
    return re.escape(module).replace(r"\{0\}", r"(\d+)") + r"\..+"


def module_of_weight(key: str) -> str:
    """The reference step (torchtitan's module) that holds HF weight ``key``
    (``model.layers.1.self_attn.q_norm.weight`` -> ``layers.1.attention.q_norm``); a tied
    lm_head's weight is the embedding, ``tok_embeddings``'s."""
    for _, hf, step in NAME_TABLE:
        match = re.fullmatch(_hf_module_pattern(hf), key)
        if match:
            return f"layers.{match.group(1)}.{step}" if match.groups() else step
    raise KeyError(f"{key}: no module of the HF Qwen3 name table (harness/parity/conformance/"
                   f"native_to_hf.py) holds it")


class NotConvertible(ValueError):
    pass


def _from_hf_backend(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """The transformers backend's state (HF names under its ``model.`` wrapper), or None."""
    if not all(k.startswith(_HF_BACKEND_PREFIX + "model.") or k == _HF_BACKEND_PREFIX + "lm_head.weight"
               for k in state):
        return None
    return {k[len(_HF_BACKEND_PREFIX):]: v for k, v in state.items()}


def hf_state_from_native(native: dict[str, torch.Tensor], config_dir: str | Path) -> dict[str, torch.Tensor]:
    """``native`` (a model's full state under torchtitan's names, or the transformers backend's)
    as the HF checkpoint of the config in ``config_dir``: every key and shape that
    ``save_pretrained`` writes for it, and no other."""
    arch = Qwen3Arch.from_dir(config_dir)
    hf = _from_hf_backend(native)
    if hf is None:
        hf = {}
        for name, tensor in native.items():
            _convert_one(name, tensor, hf)
    if arch.tie_word_embeddings and "lm_head.weight" in hf:
        if not torch.equal(hf["lm_head.weight"], hf["model.embed_tokens.weight"]):
            raise NotConvertible(f"{config_dir}: the config ties the output layer to the embedding, "
                                 f"but the state's lm_head.weight differs from its embedding")
        del hf["lm_head.weight"]
    expected = expected_hf_checkpoint(config_dir)
    missing = sorted(set(expected) - set(hf))
    unexpected = sorted(set(hf) - set(expected))
    misshaped = sorted(k for k in set(hf) & set(expected) if tuple(hf[k].shape) != expected[k][0])
    if missing or unexpected or misshaped:
        raise NotConvertible(
            f"the state does not make the HF checkpoint of {config_dir}: missing {missing[:6]}"
            f"{'...' if len(missing) > 6 else ''}, unexpected {unexpected[:6]}, mis-shaped "
            f"{[(k, tuple(hf[k].shape), expected[k][0]) for k in misshaped[:6]]} (is it this "
            f"model's state, and complete?)")
    return hf


def _convert_one(name: str, tensor: torch.Tensor, hf: dict[str, torch.Tensor]) -> None:
    for pattern, target, _ in NAME_TABLE:
        match = re.fullmatch(pattern, name)
        if match and "{e}" in target:
            for e in range(tensor.shape[0]):
                hf[target.format(*match.groups(), e=e)] = tensor[e]
            return
        if match:
            hf[target.format(*match.groups())] = tensor
            return
    if re.fullmatch(_STEP0_STATE, name):
        if torch.count_nonzero(tensor):
            raise NotConvertible(f"{name} is not zero: HF Qwen3 MoE has no load-balancing state, "
                                 f"so only a state before the first optimizer step converts")
        return
    raise NotConvertible(f"{name}: not a native Qwen3 tensor name the harness knows "
                         f"(harness/parity/conformance/native_to_hf.py lists them)")

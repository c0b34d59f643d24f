"""torchtitan modules whose hot computation runs through the harness operators, and the swap.

``CustomOpCosSinRoPE`` is ``CosSinRoPE`` with ``apply_rotary_emb`` routed through
``torch.ops.harness.rope``; ``CustomOpGroupedExperts`` is ``GroupedExperts`` with the SwiGLU
routed through ``torch.ops.harness.grouped_swiglu``. Each has its own nested ``Config``
(a subclass of the parent's, no new fields), so ``Config.build()`` builds the subclass.

``use_custom_ops(model_config)`` returns a copy of a ``Qwen3Model.Config`` in which every
layer's rope config and MoE inner-experts config are these variants; every other field is
unchanged (caches, parameter shapes, parameter init, sharding configs and parameter names are
the parent's, so checkpoints and state-dict adapters are unaffected).

DTensor inputs: a query or key sharded over its heads or its batch (tensor parallel on the
attention heads, as spring 2026's TP shards them) is rotated shard by shard (``_rope``), since
RoPE acts on each head and row alike; a sharded sequence is refused (its shard would need its
share of cos/sin). Expert weights that are DTensors are converted to local tensors exactly as
``GroupedExperts.forward`` does.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.models.common.rope import CosSinRoPE
from torchtitan.models.qwen3.model import Qwen3Model

import harness.kernels.ops  # noqa: F401  (registers torch.ops.harness.*)
from harness.upstream import titan_api


class CustomOpCosSinRoPE(CosSinRoPE):
    """``CosSinRoPE`` whose rotation is ``torch.ops.harness.rope`` (one call for q, one for k)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        pass

    @staticmethod
    def apply_rotary_emb(
        query: torch.Tensor, key: torch.Tensor, rope_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim = query.shape[-1]
        cos = rope_cache[..., :head_dim]
        sin = rope_cache[..., head_dim:]
        return _rope(query, cos, sin), _rope(key, cos, sin)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``harness::rope`` of ``x`` (B, S, H, D); a DTensor ``x`` sharded over its batch or heads
    (or replicated) is rotated on its local shard with the whole cos/sin, and keeps its
    placements."""
    if not isinstance(x, DTensor):
        return torch.ops.harness.rope(x, cos, sin)
    sharded = [p for p in x.placements if p.is_shard() and p.dim % x.ndim not in (0, 2)]
    if sharded or any(not (p.is_shard() or p.is_replicate()) for p in x.placements):
        raise NotImplementedError(
            f"harness::rope on a DTensor placed {x.placements}: only its batch (dim 0) or heads "
            f"(dim 2) may be sharded; a sharded sequence needs its share of cos/sin")
    cos, sin = (t.full_tensor() if isinstance(t, DTensor) else t for t in (cos, sin))
    return DTensor.from_local(torch.ops.harness.rope(x.to_local(), cos, sin), x.device_mesh, x.placements,
                              run_check=False)


class CustomOpGroupedExperts(GroupedExperts):
    """``GroupedExperts`` whose SwiGLU is ``torch.ops.harness.grouped_swiglu``."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        pass

    def _grouped_swiglu(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        w1_EFD, w2_EDF, w3_EFD = self.w1_EFD, self.w2_EDF, self.w3_EFD
        if isinstance(w1_EFD, DTensor):
            w1_EFD, w2_EDF, w3_EFD = w1_EFD.to_local(), w2_EDF.to_local(), w3_EFD.to_local()
        offsets_E = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)
        return torch.ops.harness.grouped_swiglu(x_RD, offsets_E, w1_EFD, w2_EDF, w3_EFD)


# The GroupedExperts method that computes on already-dispatched tokens differs per torchtitan
# generation ("forward" on 0.3.0, "_experts_forward" on spring-2026 main): harness.upstream.titan_api.
setattr(CustomOpGroupedExperts, titan_api.GROUPED_EXPERTS_COMPUTE_METHOD,
        CustomOpGroupedExperts._grouped_swiglu)


def _convert(config, target_cls):
    """A ``target_cls`` config with every init field copied from ``config``."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return target_cls(**values)


def _replace_all(root, source_cls, target_cls) -> int:
    """Replace every config whose type is exactly ``source_cls`` under ``root``; keep sharing."""
    converted: dict[int, object] = {}
    count = 0
    for _fqn, cfg, parent, attr in list(root.traverse(source_cls)):
        if type(cfg) is not source_cls or parent is None:
            continue
        new = converted.setdefault(id(cfg), _convert(cfg, target_cls))
        if isinstance(parent, list):
            parent[attr] = new
        else:
            setattr(parent, attr, new)
        count += 1
    return count


def use_custom_ops(model_config):
    """Copy of a ``Qwen3Model.Config`` with RoPE and the MoE experts on the harness operators.

    Raises ``TypeError`` for a config that is not a Qwen3Model.Config and ``ValueError`` when a
    layer's rope is not rotate-half (``CosSinRoPE``) or a layer ends up unconverted.
    """
    if not isinstance(model_config, Qwen3Model.Config):
        raise TypeError(f"use_custom_ops expects a Qwen3Model.Config, got {type(model_config).__name__}")
    new = copy.deepcopy(model_config)
    _replace_all(new, CosSinRoPE.Config, CustomOpCosSinRoPE.Config)
    _replace_all(new, GroupedExperts.Config, CustomOpGroupedExperts.Config)
    for i, layer in enumerate(new.layers):
        rope = layer.attention.rope
        if not isinstance(rope, CustomOpCosSinRoPE.Config):
            raise ValueError(f"layer {i}: rope config {type(rope).__qualname__} is not a CosSinRoPE.Config")
        moe = getattr(layer, "moe", None)
        if moe is not None:
            inner = titan_api.moe_grouped_experts(moe)
            if not isinstance(inner, CustomOpGroupedExperts.Config):
                raise ValueError(f"layer {i}: inner experts config {type(inner).__qualname__} "
                                 f"is not GroupedExperts.Config")
    return new

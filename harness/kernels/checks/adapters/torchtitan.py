"""torchtitan 0.3.0 production code under test.

rotary_embedding  CosSinRoPE (cache build + _reshape_cache + apply_rotary_emb, via forward)
rms_norm          torchtitan.models.common.nn_modules.RMSNorm (nn.RMSNorm)
moe_router        TokenChoiceTopKRouter built by make_router_config as Qwen3 MoE builds it
                  (softmax, route_norm=True)
grouped_swiglu    GroupedExperts.forward
cross_entropy     torchtitan.components.loss.CrossEntropyLoss (the trainer's loss component)
"""

from __future__ import annotations

import functools

import torch
from torch.func import functional_call
from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.models.common.rope import CosSinRoPE

from harness.kernels.checks.spec import torch_device
from harness.upstream import titan_api


def _on(device: str):
    return torch_device(device)


@functools.lru_cache(maxsize=8)
def _rope_module(dim: int, theta: float, max_seq_len: int, device: str):
    return CosSinRoPE.Config(dim=dim, max_seq_len=max_seq_len, theta=theta).build().to(_on(device))


def rope_max_seq_len(positions: torch.Tensor) -> int:
    """Qwen3's 40960, or more if a case's positions need it."""
    return max(40960, int(positions.max()) + 1)


def rotary_embedding(inputs, params, device):
    x, positions = inputs["x"], inputs["positions"]
    module = _rope_module(x.shape[-1], params["theta"], rope_max_seq_len(positions), device)
    y, _ = module(x, x, positions)
    return {"y": y}


def rms_norm(inputs, params, device):
    from torchtitan.models.common.nn_modules import RMSNorm  # noqa: PLC0415  generation: torchtitan 0.3.0's module path; the registry imports under any generation

    x, weight = inputs["x"], inputs["weight"]
    module = RMSNorm.Config(normalized_shape=x.shape[-1], eps=params["eps"]).build()
    module = module.to(device=_on(device), dtype=x.dtype)
    return {"y": functional_call(module, {"weight": weight}, (x,))}


def moe_router(inputs, params, device):
    from torchtitan.models.common.config_utils import make_router_config  # noqa: PLC0415  generation: torchtitan 0.3.0's module path; the registry imports under any generation

    x, gate = inputs["x"], inputs["gate_weight"]
    config = make_router_config(
        dim=x.shape[-1],
        num_experts=gate.shape[0],
        gate_param_init={},
        top_k=params["top_k"],
        score_func="softmax",
        route_norm=True,
    )
    module = config.build().to(device=_on(device), dtype=x.dtype)
    scores, ids, _ = functional_call(module, {"gate.weight": gate}, (x[None],))
    return {"weights": scores[0], "ids": ids[0]}


def router_output_dtypes(dtype, device):
    """torchtitan's router means its scores to be float32 ("scores_BLE is already float32 from
    the autocast above")."""
    return {"weights": torch.float32}


def grouped_swiglu(inputs, params, device):
    x, w1, w2, w3 = inputs["x"], inputs["w1"], inputs["w2"], inputs["w3"]
    config = titan_api.grouped_experts_config(GroupedExperts.Config, dim=w1.shape[2], hidden_dim=w1.shape[1],
                                              num_experts=w1.shape[0])
    module = config.build().to(device=_on(device))
    y = titan_api.grouped_experts_compute(module, x, inputs["num_tokens_per_expert"],
                                          {"w1_EFD": w1, "w2_EDF": w2, "w3_EFD": w3})
    return {"y": y}


def cross_entropy(inputs, params, device):
    loss_fn = CrossEntropyLoss.Config().build()
    return {"loss": titan_api.call_loss(loss_fn, inputs["logits"], inputs["labels"])}

"""The harness custom operators (harness/kernels/ops), through the torchtitan module subclasses the
nki_moe backend builds: ``CustomOpCosSinRoPE`` and ``CustomOpGroupedExperts``.

On "cpu"/"cuda" this runs the ops' torch kernels; on "neuron" the ops dispatch to the NKI
kernels registered by harness.kernels.ops.neuron.
"""

from __future__ import annotations

import functools

from harness.kernels.checks.adapters.torchtitan import rope_max_seq_len
from harness.kernels.checks.spec import torch_device
from harness.kernels.ops.modules import CustomOpCosSinRoPE, CustomOpGroupedExperts
from harness.upstream import titan_api


def _on(device: str):
    return torch_device(device)


@functools.lru_cache(maxsize=8)
def _rope_module(dim: int, theta: float, max_seq_len: int, device: str):
    return CustomOpCosSinRoPE.Config(dim=dim, max_seq_len=max_seq_len, theta=theta).build().to(_on(device))


def rotary_embedding(inputs, params, device):
    x, positions = inputs["x"], inputs["positions"]
    module = _rope_module(x.shape[-1], params["theta"], rope_max_seq_len(positions), device)
    y, _ = module(x, x, positions)
    return {"y": y}


def grouped_swiglu(inputs, params, device):
    x, w1, w2, w3 = inputs["x"], inputs["w1"], inputs["w2"], inputs["w3"]
    config = titan_api.grouped_experts_config(CustomOpGroupedExperts.Config, dim=w1.shape[2],
                                              hidden_dim=w1.shape[1], num_experts=w1.shape[0])
    module = config.build().to(device=_on(device))
    y = titan_api.grouped_experts_compute(module, x, inputs["num_tokens_per_expert"],
                                          {"w1_EFD": w1, "w2_EDF": w2, "w3_EFD": w3})
    return {"y": y}

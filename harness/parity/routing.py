"""MoE routing and expert math, one layer at a time on identical inputs ("teacher forcing").

In a full forward pass the MoE layers of two implementations see slightly different inputs
(bf16 experts upstream), so near-tied experts can legitimately swap. Here every
implementation's router and MoE block get the *same* input -- the reference's input to that
layer -- so routing must agree exactly (expert sets per token) and the routing weights to fp32
precision; the block outputs then differ only by the expert precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.kernels.ops.rms_norm_torch import rms_norm
from harness.parity.compare import TensorDiff, diff_id_sets, diff_tensors
from harness.parity.models import ParityModel
from harness.references import model as reference
from harness.references.batch import Batch
from harness.registry.tolerances import parity_tolerance as tolerance


@dataclass
class LayerRouting:
    layer: int
    x: torch.Tensor  # [T, D] input to the MoE block (after ffn norm), from the reference


def moe_inputs(ref: ParityModel, batch: Batch) -> list[LayerRouting]:
    """Each MoE layer's block input, captured from the reference forward."""
    arch = ref.arch
    weights = ref.module.weights()  # type: ignore[union-attr]
    record: dict = {}
    with torch.no_grad():
        reference.forward(weights, arch, batch.inputs, batch.positions, record=record)
    out = []
    for i in range(arch.num_hidden_layers):
        if not arch.layer_is_moe(i):
            continue
        h_after_attn = record[f"layers.{i}"] - record[f"layers.{i}.mlp"]
        x = rms_norm(h_after_attn, weights[f"model.layers.{i}.post_attention_layernorm.weight"],
                     arch.rms_norm_eps)
        out.append(LayerRouting(i, x.reshape(-1, x.shape[-1])))
    return out


def native_route(model: ParityModel, layer: int, x_TD: torch.Tensor):
    """(weights [T, K], ids [T, K]) from torchtitan's router module (expert bias as loaded)."""
    moe = model.module.layers[str(layer)].moe
    with torch.no_grad():
        scores, ids, _ = moe.router(x_TD[None], moe.expert_bias_E)
    return scores.reshape(-1, scores.shape[-1]), ids.reshape(-1, ids.shape[-1])


def hf_route(model: ParityModel, layer: int, x_TD: torch.Tensor):
    mlp = model.module.model.layers[layer].mlp
    with torch.no_grad():
        _, weights, ids = mlp.gate(x_TD)
    return weights, ids


def reference_route(model: ParityModel, layer: int, x_TD: torch.Tensor, *, by_value: bool = True):
    w = model.module.weights()  # type: ignore[union-attr]
    with torch.no_grad():
        weights, ids, _ = reference.route(x_TD, w[f"model.layers.{layer}.mlp.gate.weight"], model.arch,
                                          by_value=by_value)
    return weights, ids


def native_block(model: ParityModel, layer: int, x_TD: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.module.layers[str(layer)].moe(x_TD[None]).reshape(x_TD.shape)


def hf_block(model: ParityModel, layer: int, x_TD: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.module.model.layers[layer].mlp(x_TD[None]).reshape(x_TD.shape)


def reference_block(model: ParityModel, layer: int, x_TD: torch.Tensor, expert_dtype=None) -> torch.Tensor:
    w = model.module.weights()  # type: ignore[union-attr]
    with torch.no_grad():
        out, _, _ = reference.moe(x_TD, w, model.arch, f"model.layers.{layer}.mlp",
                                  expert_dtype=expert_dtype)
        return out


def _align(weights: torch.Tensor, ids: torch.Tensor):
    order = ids.argsort(dim=-1)
    return weights.gather(-1, order), ids.gather(-1, order)


def routing_diffs(name: str, got: tuple, want: tuple, layer: int) -> list[TensorDiff]:
    """Expert sets per token must match exactly; weights (matched by expert id) to fp32."""
    (gw, gi), (ww, wi) = got, want
    ids = diff_id_sets(f"layer {layer} {name} expert ids", gi, wi, 0.0)
    out = [ids]
    if ids.ok:
        gw_, _ = _align(gw.float(), gi)
        ww_, _ = _align(ww.float(), wi)
        out.append(diff_tensors(f"layer {layer} {name} routing weights", gw_, ww_,
                                tolerance("activations", "float32")))
    return out


def weights_sum_violations(weights: torch.Tensor, normalised: bool, name: str, layer: int) -> list[str]:
    """With norm_topk_prob the k routing weights of each token sum to 1 (fp32 rounding)."""
    if not normalised:
        return []
    sums = weights.float().sum(-1)
    worst = float((sums - 1).abs().max())
    bound = tolerance("activations", "float32").bound(1.0)
    if worst > bound:
        i = int((sums - 1).abs().argmax())
        return [f"layer {layer} {name}: top-k routing weights sum to {float(sums[i]):.6f} for token {i} "
                f"(max |sum-1| {worst:.3e} > {bound:.1e}) although norm_topk_prob=True"]
    return []

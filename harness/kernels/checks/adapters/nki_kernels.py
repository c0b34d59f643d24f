"""The harness NKI kernels (harness/kernels/ops/nki). RoPE forward only (its backward is the op's torch
autograd formula); the grouped SwiGLU forward and backward (the backward in NKI: our forward's
recompute and nki-library's blockwise backward, harness/kernels/ops/nki/grouped_swiglu_backward.py).

"nki-emu": the kernel body on the harness's NKI emulator (harness/kernels/emu), on CPU tensors.
"nki-sim": ``nki.simulate(kernel)`` pinned to trn2 on CPU tensors (needs the real ``nki``).
"neuron":  the kernel called on Neuron tensors (needs torch-neuronx and a NeuronCore).
"cpu" (implementation ``nki_contract``): the kernel's torch twin (``X_torch.py`` beside the
           kernel) through the same layout wrappers -- checks the wrappers and the contract
           everywhere, without ``nki``.

The cos/sin fed to the RoPE kernel come from torchtitan's CosSinRoPE cache, as in the model.
"""

from __future__ import annotations

import torch

from harness.kernels.checks.adapters.harness_ops import _rope_module
from harness.kernels.checks.adapters.torchtitan import rope_max_seq_len
from harness.kernels.ops.nki.grouped_swiglu_kernel_torch import grouped_swiglu_kernel_torch_ref
from harness.kernels.ops.nki.rope_kernel_torch import rope_halves_kernel_torch_ref
from harness.kernels.ops.nki.simulation import simulated


def _cos_sin(inputs, params, device):
    x, positions = inputs["x"], inputs["positions"]
    module = _rope_module(x.shape[-1], params["theta"], rope_max_seq_len(positions),
                          "cpu" if device == "nki-emu" else device)
    cache = module._reshape_cache(x, positions)
    dim = x.shape[-1]
    return cache[..., :dim], cache[..., dim:]


def rotary_embedding(inputs, params, device):
    from harness.kernels.ops.nki import rope_kernel  # noqa: PLC0415  optional: the kernel imports nki where installed; the registry loads without it

    cos, sin = _cos_sin(inputs, params, device)
    x = inputs["x"]
    if device == "nki-emu":
        return {"y": rope_kernel.rope_emulated(x, cos, sin)}
    if device == "nki-sim":
        return {"y": rope_kernel.rope_simulated(x, cos, sin)}
    if device == "neuron":
        return {"y": rope_kernel.rope_neuron(x, cos, sin)}

    return {"y": rope_kernel.rope_via(rope_halves_kernel_torch_ref, x, cos, sin)}


GROUPED_SWIGLU_MODULE = "harness.kernels.ops.nki.grouped_swiglu_kernel"


class _GroupedSwigluKernels(torch.autograd.Function):
    """The op's autograd on explicit kernels: ``forward(x, offsets, w1, w2, w3) -> y`` and
    ``backward(grad, x, offsets, w1, w2, w3) -> (dx, dw1, dw2, dw3)``."""

    @staticmethod
    def forward(ctx, x, offsets, w1, w2, w3, calls):
        ctx.save_for_backward(x, offsets, w1, w2, w3)
        ctx.calls = calls
        return calls[0](x, offsets, w1, w2, w3)

    @staticmethod
    def backward(ctx, grad):
        dx, dw1, dw2, dw3 = ctx.calls[1](grad, *ctx.saved_tensors)
        return dx, None, dw1, dw2, dw3, None


def _simulated_calls():
    """(forward, backward) under the real ``nki.simulate`` pinned to trn2, LNC=2."""
    from harness.kernels.ops.nki import grouped_swiglu_backward as gb  # noqa: PLC0415  optional: the kernel imports nki where installed; the registry loads without it
    from harness.kernels.ops.nki import grouped_swiglu_kernel as gk  # noqa: PLC0415  optional: the kernel imports nki where installed; the registry loads without it

    library = gb._library_module("nki-sim").blockwise_mm_bwd

    def backward(grad, x, offsets, w1, w2, w3):
        return gb.grouped_swiglu_backward_via(simulated(gk.launched(gk.grouped_swiglu_checkpoint_kernel)),
                                              simulated(gk.launched(library)), grad, x, offsets, w1, w2, w3)

    return gk.grouped_swiglu_simulated, backward


def grouped_swiglu_calls(device: str):
    """(forward, backward) of the op through our NKI forward kernel and the NKI backward on
    ``device`` ("nki-emu", "nki-sim" or "neuron")."""
    from harness.kernels.ops.nki import grouped_swiglu_backward as gb  # noqa: PLC0415  optional: the kernel imports nki where installed; the registry loads without it
    from harness.kernels.ops.nki import grouped_swiglu_kernel as gk  # noqa: PLC0415  optional: the kernel imports nki where installed; the registry loads without it

    if device == "nki-emu":
        return gk.grouped_swiglu_emulated, gb.grouped_swiglu_backward_emulated
    if device == "nki-sim":
        return _simulated_calls()
    return gk.grouped_swiglu_neuron, gb.grouped_swiglu_backward_neuron


def grouped_swiglu(inputs, params, device):
    from harness.kernels.ops.nki import grouped_swiglu_kernel as gk  # noqa: PLC0415  optional: the kernel imports nki where installed; the registry loads without it

    x, w1, w2, w3 = inputs["x"], inputs["w1"], inputs["w2"], inputs["w3"]
    offsets = torch.cumsum(inputs["num_tokens_per_expert"], 0, dtype=torch.int32).to(x.device)
    if device == "cpu":
        return {"y": gk.grouped_swiglu_via(grouped_swiglu_kernel_torch_ref, x, offsets, w1, w2, w3)}
    return {"y": _GroupedSwigluKernels.apply(x, offsets, w1, w2, w3, grouped_swiglu_calls(device))}

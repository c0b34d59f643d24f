"""The harness NKI kernels (harness/ops/nki), forward only.

"nki-sim": ``nki.simulate(kernel)`` on CPU tensors (needs the real ``nki``).
"neuron":  the kernel called on Neuron tensors (needs torch-neuronx and a NeuronCore).
"cpu" (implementation ``nki_contract``): the kernel's torch twin through the same layout
           wrappers -- checks the wrappers and the contract everywhere, without ``nki``.

The cos/sin fed to the RoPE kernel come from torchtitan's CosSinRoPE cache, as in the model.
"""

from __future__ import annotations

from harness.kernels.adapters.harness_ops import _rope_module
from harness.kernels.adapters.torchtitan import rope_max_seq_len


def _cos_sin(inputs, params, device):
    x, positions = inputs["x"], inputs["positions"]
    module = _rope_module(x.shape[-1], params["theta"], rope_max_seq_len(positions), device)
    cache = module._reshape_cache(x, positions)
    dim = x.shape[-1]
    return cache[..., :dim], cache[..., dim:]


def rotary_embedding(inputs, params, device):
    from harness.ops.nki import rope_kernel

    cos, sin = _cos_sin(inputs, params, device)
    x = inputs["x"]
    if device == "nki-sim":
        return {"y": rope_kernel.rope_simulated(x, cos, sin)}
    if device == "neuron":
        return {"y": rope_kernel.rope_neuron(x, cos, sin)}
    return {"y": rope_kernel.rope_via(rope_kernel.rope_halves_reference, x, cos, sin)}


def grouped_swiglu(inputs, params, device):
    from harness.ops.nki import grouped_swiglu_kernel as gk

    x, w1, w2, w3 = inputs["x"], inputs["w1"], inputs["w2"], inputs["w3"]
    counts = [int(c) for c in inputs["num_tokens_per_expert"].tolist()]
    if device == "nki-sim":
        return {"y": gk.grouped_swiglu_simulated(x, counts, w1, w2, w3)}
    if device == "neuron":
        import torch

        offsets = torch.cumsum(inputs["num_tokens_per_expert"], 0, dtype=torch.int32)
        return {"y": gk.grouped_swiglu_neuron(x, offsets, w1, w2, w3)}
    return {"y": gk.grouped_swiglu_via(gk.grouped_swiglu_reference, x, counts, w1, w2, w3)}

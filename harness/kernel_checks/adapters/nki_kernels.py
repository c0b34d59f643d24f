"""The harness NKI kernels (harness/ops/nki), forward only (backward is the ops' torch
autograd formula, which runs as ordinary torch ops on every device).

"nki-emu": the kernel body on the harness's NKI emulator (harness/nki_emu), on CPU tensors.
"nki-sim": ``nki.simulate(kernel)`` pinned to trn2 on CPU tensors (needs the real ``nki``).
"neuron":  the kernel called on Neuron tensors (needs torch-neuronx and a NeuronCore).
"cpu" (implementation ``nki_contract``): the kernel's torch twin (``X_torch.py`` beside the
           kernel) through the same layout wrappers -- checks the wrappers and the contract
           everywhere, without ``nki``.

The cos/sin fed to the RoPE kernel come from torchtitan's CosSinRoPE cache, as in the model.
"""

from __future__ import annotations

from harness.kernel_checks.adapters.harness_ops import _rope_module
from harness.kernel_checks.adapters.torchtitan import rope_max_seq_len


def _cos_sin(inputs, params, device):
    x, positions = inputs["x"], inputs["positions"]
    module = _rope_module(x.shape[-1], params["theta"], rope_max_seq_len(positions), "cpu" if device == "nki-emu" else device)
    cache = module._reshape_cache(x, positions)
    dim = x.shape[-1]
    return cache[..., :dim], cache[..., dim:]


def rotary_embedding(inputs, params, device):
    from harness.ops.nki import rope_kernel

    cos, sin = _cos_sin(inputs, params, device)
    x = inputs["x"]
    if device == "nki-emu":
        return {"y": rope_kernel.rope_emulated(x, cos, sin)}
    if device == "nki-sim":
        return {"y": rope_kernel.rope_simulated(x, cos, sin)}
    if device == "neuron":
        return {"y": rope_kernel.rope_neuron(x, cos, sin)}
    from harness.ops.nki.rope_kernel_torch import rope_halves_kernel_torch_ref

    return {"y": rope_kernel.rope_via(rope_halves_kernel_torch_ref, x, cos, sin)}


GROUPED_SWIGLU_MODULE = "harness.ops.nki.grouped_swiglu_kernel"


def grouped_swiglu(inputs, params, device):
    import torch

    from harness.ops.nki import grouped_swiglu_kernel as gk
    from harness.ops.nki.grouped_swiglu_kernel_torch import grouped_swiglu_kernel_torch_ref

    x, w1, w2, w3 = inputs["x"], inputs["w1"], inputs["w2"], inputs["w3"]
    offsets = torch.cumsum(inputs["num_tokens_per_expert"], 0, dtype=torch.int32)
    if device == "nki-emu":
        from harness import nki_emu

        kernel = nki_emu.import_module(GROUPED_SWIGLU_MODULE).grouped_swiglu_kernel
        return {"y": gk.grouped_swiglu_via(nki_emu.run(kernel), x, offsets, w1, w2, w3)}
    if device == "nki-sim":
        from harness.ops.nki.simulation import simulated

        return {"y": gk.grouped_swiglu_via(simulated(gk.grouped_swiglu_kernel), x, offsets, w1, w2, w3)}
    if device == "neuron":
        return {"y": gk.grouped_swiglu_neuron(x, offsets, w1, w2, w3)}
    return {"y": gk.grouped_swiglu_via(grouped_swiglu_kernel_torch_ref, x, offsets, w1, w2, w3)}

"""aws-neuron/nki-library kernels: on "nki-emu" (the harness's NKI emulator, with the
standalone wheel ``nkilib_src.nkilib``), "nki-sim" (the real ``nki.simulate``, trn2) and
"neuron". The module is ``nkilib.X`` where neuronx-cc bundles it and ``nkilib_src.nkilib.X``
from the standalone wheel (``harness.ops.neuron.nkilib_module``).

rotary_embedding  core.embeddings.rope.RoPE(x [D, B, H, S], cos/sin [D/2, B, S]), forward only.
cross_entropy     experimental.loss.cross_entropy: cross_entropy_forward(logits [N, V],
                  targets [N] int32, dtype=...) -> (per-position loss, lse), summed here over
                  non-ignored positions (the kernel has no ignore_index); the backward is the
                  library's cross_entropy_backward(reduction="sum") scaled by the upstream
                  gradient. The module is ``experimental.loss.cross_entropy`` in nki-library's
                  2026-04 release and the Neuron 2.33 docs, ``core.loss.cross_entropy`` in the
                  January and February 2026 releases: ``cross_entropy_module`` tries them in
                  that order and says which one it found.
"""

from __future__ import annotations

import torch

from harness.kernel_checks.adapters.nki_kernels import _cos_sin

EMULATOR_PACKAGE = "nkilib_src.nkilib"  # the standalone wheel, the one CI installs


def _module(path: str, device: str):
    if device == "nki-emu":
        from harness import nki_emu

        return nki_emu.import_module(f"{EMULATOR_PACKAGE}.{path}")
    from harness.ops.neuron import nkilib_module

    return nkilib_module(path)


def _call(kernel, device):
    if device == "nki-emu":
        from harness import nki_emu

        return nki_emu.run(kernel)
    if device == "nki-sim":
        from harness.ops.neuron import simulated

        return simulated(kernel)
    return kernel


def _language(device):
    if device == "nki-emu":
        from harness.nki_emu import language

        return language
    import nki.language

    return nki.language


def rotary_embedding(inputs, params, device):
    RoPE = _module("core.embeddings.rope", device).RoPE
    x = inputs["x"]
    cos, sin = _cos_sin(inputs, params, device)
    half = x.shape[-1] // 2
    batch = x.shape[0]
    cos_k = cos[..., :half].expand(batch, -1, -1, -1)[:, :, 0, :].permute(2, 0, 1).contiguous().to(x.dtype)
    sin_k = sin[..., :half].expand(batch, -1, -1, -1)[:, :, 0, :].permute(2, 0, 1).contiguous().to(x.dtype)
    out = _call(RoPE, device)(x.permute(3, 0, 2, 1).contiguous(), cos_k, sin_k)
    return {"y": torch.as_tensor(out).permute(1, 3, 2, 0).contiguous()}


CROSS_ENTROPY_MODULES = ("nkilib.experimental.loss.cross_entropy", "nkilib.core.loss.cross_entropy")


def cross_entropy_module(import_module=None, device: str = "neuron"):
    """(module, which path was found, [why the earlier paths were not]) for nki-library's cross
    entropy, trying the documented path first; ImportError naming every path tried if none."""
    import_module = import_module or (lambda name: _module(name.removeprefix("nkilib."), device))
    missed = []
    for name in CROSS_ENTROPY_MODULES:
        try:
            return import_module(name), name, missed
        except ImportError as error:
            missed.append(f"{name}: {type(error).__name__}: {error}")
    raise ImportError("nki-library cross entropy not found; tried " + "; ".join(missed))


class _LibraryCrossEntropy(torch.autograd.Function):
    """Summed loss by the library's forward kernel; gradient by its backward kernel."""

    @staticmethod
    def forward(ctx, logits, targets, module, device, options):
        loss, lse = _call(module.cross_entropy_forward, device)(logits.detach().contiguous(), targets, **options)
        ctx.save_for_backward(logits, targets, torch.as_tensor(lse))
        ctx.module, ctx.device, ctx.options = module, device, options
        return torch.as_tensor(loss).float().sum()

    @staticmethod
    def backward(ctx, grad_loss):
        logits, targets, lse = ctx.saved_tensors
        grad = _call(ctx.module.cross_entropy_backward, ctx.device)(
            logits.detach().contiguous(), targets, lse, reduction="sum", inplace=False, **ctx.options)
        return torch.as_tensor(grad).to(logits.dtype) * grad_loss.to(logits.dtype), None, None, None, None


def cross_entropy(inputs, params, device):
    nl = _language(device)
    module = cross_entropy_module(device=device)[0]
    logits, labels = inputs["logits"], inputs["labels"]
    flat = logits.reshape(-1, logits.shape[-1])
    target = labels.reshape(-1)
    keep = target != -100
    dtype = nl.float32 if logits.dtype == torch.float32 else nl.bfloat16
    options = {"chunk_size": min(16384, flat.shape[-1]), "dtype": dtype}
    kept = flat[keep]
    return {"loss": _LibraryCrossEntropy.apply(kept, target[keep].to(torch.int32).contiguous(), module, device, options)}

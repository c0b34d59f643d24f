"""aws-neuron/nki-library kernels, when the ``nkilib`` package (and the real ``nki``) is
installed. NOT YET RUN: written against the kernels' documented signatures; forward only.

rotary_embedding  nkilib.core.embeddings.rope.RoPE(x [D, B, H, S], cos/sin [D/2, B, S])
cross_entropy     nkilib.experimental.loss.cross_entropy.cross_entropy_forward(logits [N, V],
                  targets [N] int32, dtype=...) -> (per-position loss, lse); summed here over
                  non-ignored positions (the kernel has no ignore_index). The module is
                  ``nkilib.experimental.loss.cross_entropy`` in nki-library's 2026-04 release and
                  the Neuron 2.33 docs, ``nkilib.core.loss.cross_entropy`` in the January and
                  February 2026 releases: ``cross_entropy_module`` tries them in that order and
                  says which one it found.
"""

from __future__ import annotations

import torch

from harness.kernel_checks.adapters.nki_kernels import _cos_sin


def _call(kernel, device):
    if device == "nki-sim":
        import nki

        return nki.simulate(kernel)
    return kernel


def rotary_embedding(inputs, params, device):
    from nkilib.core.embeddings.rope import RoPE

    x = inputs["x"]
    cos, sin = _cos_sin(inputs, params, device)
    half = x.shape[-1] // 2
    batch = x.shape[0]
    cos_k = cos[..., :half].expand(batch, -1, -1, -1)[:, :, 0, :].permute(2, 0, 1).contiguous().to(x.dtype)
    sin_k = sin[..., :half].expand(batch, -1, -1, -1)[:, :, 0, :].permute(2, 0, 1).contiguous().to(x.dtype)
    out = _call(RoPE, device)(x.permute(3, 0, 2, 1).contiguous(), cos_k, sin_k)
    return {"y": torch.as_tensor(out).permute(1, 3, 2, 0).contiguous()}


CROSS_ENTROPY_MODULES = ("nkilib.experimental.loss.cross_entropy", "nkilib.core.loss.cross_entropy")


def cross_entropy_module(import_module=None):
    """(module, which path was found, [why the earlier paths were not]) for nki-library's cross
    entropy, trying the documented path first; ImportError naming every path tried if none."""
    import importlib

    import_module = import_module or importlib.import_module
    missed = []
    for name in CROSS_ENTROPY_MODULES:
        try:
            return import_module(name), name, missed
        except ImportError as error:
            missed.append(f"{name}: {type(error).__name__}: {error}")
    raise ImportError("nki-library cross entropy not found; tried " + "; ".join(missed))


def cross_entropy(inputs, params, device):
    import nki.language as nl

    cross_entropy_forward = cross_entropy_module()[0].cross_entropy_forward

    logits, labels = inputs["logits"], inputs["labels"]
    flat = logits.reshape(-1, logits.shape[-1])
    target = labels.reshape(-1)
    keep = target != -100
    dtype = nl.float32 if logits.dtype == torch.float32 else nl.bfloat16
    chunk = min(32768, flat.shape[-1])
    loss, _lse = _call(cross_entropy_forward, device)(
        flat[keep].contiguous(), target[keep].to(torch.int32).contiguous(), chunk_size=chunk, dtype=dtype
    )
    return {"loss": torch.as_tensor(loss).float().sum()}

"""aws-neuron/nki-library kernels: on "nki-emu" (the harness's NKI emulator, with the
standalone wheel ``nkilib_src.nkilib``), "nki-sim" (the real ``nki.simulate``, trn2) and
"neuron". The module is ``nkilib.X`` where neuronx-cc bundles it and ``nkilib_src.nkilib.X``
from the standalone wheel (``harness.kernels.ops.nki.simulation.nkilib_module``).

rotary_embedding  core.embeddings.rope.RoPE(x [D, B, H, S], cos/sin [D/2, B, S]), forward only.
cross_entropy     experimental.loss.cross_entropy: cross_entropy_forward(logits [N, V],
                  targets [N] int32, dtype=...) -> (per-position loss, lse), summed here over
                  non-ignored positions (the kernel has no ignore_index); the backward is the
                  library's cross_entropy_backward(reduction="sum") scaled by the upstream
                  gradient. The module is ``experimental.loss.cross_entropy`` in nki-library's
                  2026-04 release and the Neuron 2.33 docs, ``core.loss.cross_entropy`` in the
                  January and February 2026 releases: ``cross_entropy_module`` tries them in
                  that order and says which one it found.
grouped_swiglu    core.moe.moe_cte.bwmm_shard_on_block, routed rows as one-hot tokens, forward
                  only, launched as kernel[2] (LNC=2).
"""

from __future__ import annotations

import torch

from harness.kernels import emu as nki_emu
from harness.kernels.checks.adapters.nki_kernels import _cos_sin
from harness.kernels.emu import language
from harness.kernels.ops import grouped_swiglu as gs
from harness.kernels.ops.cross_entropy_torch import IGNORE_INDEX
from harness.kernels.ops.nki.simulation import nkilib_module, simulated

EMULATOR_PACKAGE = "nkilib_src.nkilib"  # the standalone wheel, the one CI installs


def _module(path: str, device: str):
    if device == "nki-emu":
        return nki_emu.import_module(f"{EMULATOR_PACKAGE}.{path}")

    return nkilib_module(path)


def _call(kernel, device):
    if device == "nki-emu":
        return nki_emu.run(kernel)
    if device == "nki-sim":
        return simulated(kernel)
    return kernel


def _language(device):
    if device == "nki-emu":
        return language
    import nki.language  # noqa: PLC0415  optional: the real nki (Neuron SDK) may be absent

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
    keep = target != IGNORE_INDEX
    dtype = nl.float32 if logits.dtype == torch.float32 else nl.bfloat16
    options = {"chunk_size": min(16384, flat.shape[-1]), "dtype": dtype}
    kept = flat[keep]
    targets = target[keep].to(torch.int32).contiguous()
    return {"loss": _LibraryCrossEntropy.apply(kept, targets, module, device, options)}


# ---------------------------------------------------------------- grouped SwiGLU: blockwise MoE

BWMM_BLOCK = 128  # bwmm_shard_on_block gathers its tokens in tiles of 128: block size a multiple of it


def grouped_swiglu(inputs, params, device):
    """``core.moe.moe_cte.bwmm_shard_on_block`` (nki-library's blockwise MoE, forward) as
    ``harness::grouped_swiglu``. Each routed row is a "token" whose one expert is its own:
    affinity 1.0 there and 0 elsewhere, applied after the down projection (POST_SCALE, exact
    for 1.0), so the library's top-k combine is the identity. The blocks and ``block_to_expert``
    are ``harness.kernels.ops.grouped_swiglu.block_layout``'s at B = 128; padding positions name the
    zero token ``R``. D is zero-padded to a multiple of 512 (the kernel tiles H by PSUM banks of
    512) and F to a multiple of 16 (its vector DGE needs a partition count of 1 or 16k); zero
    features add nothing to any GEMM and silu(0) * 0 = 0. Launched on two programs (LNC=2):
    its PING_PONG split reads ``block_to_expert`` with stride 2. Rows owned by no expert are
    zero."""
    kernel = _module("core.moe.moe_cte.bwmm_shard_on_block", device).bwmm_shard_on_block
    x, w1, w2, w3 = (inputs[k] for k in ("x", "w1", "w2", "w3"))
    offsets = torch.cumsum(inputs["num_tokens_per_expert"], 0, dtype=torch.int32).to(x.device)
    rows, dim = x.shape
    experts, hidden, _ = w1.shape
    dim_p, hidden_p = -(-dim // 512) * 512, -(-hidden // 16) * 16
    bf = torch.bfloat16
    slots, block_expert = gs.block_layout(offsets, rows, BWMM_BLOCK)
    token_of_position = torch.full((block_expert.shape[0] * BWMM_BLOCK + 1,), rows, dtype=torch.int32, device=x.device)
    token_of_position[slots] = torch.arange(rows, dtype=torch.int32, device=x.device)
    owner = torch.searchsorted(offsets.to(torch.int64), torch.arange(rows, device=x.device), right=True)
    owned = owner < experts
    hidden_states = x.new_zeros(rows + 1, dim_p, dtype=bf)
    hidden_states[:rows, :dim] = x.to(bf)
    affinities = x.new_zeros(rows + 1, experts, dtype=bf)
    affinities[torch.arange(rows, device=x.device)[owned], owner[owned]] = 1
    gate_up = x.new_zeros(experts, dim_p, 2, hidden_p, dtype=bf)
    gate_up[:, :dim, 0, :hidden] = w1.to(bf).transpose(-2, -1)
    gate_up[:, :dim, 1, :hidden] = w3.to(bf).transpose(-2, -1)
    down = x.new_zeros(experts, hidden_p, dim_p, dtype=bf)
    down[:, :hidden, :dim] = w2.to(bf).transpose(-2, -1)
    out = _call(kernel[2], device)(
        hidden_states, affinities.reshape(-1, 1), gate_up, down, BWMM_BLOCK, token_of_position[:-1],
        block_expert.reshape(-1, 1), is_tensor_update_accumulating=False,
    )
    y = torch.as_tensor(out)[:rows, :dim].to(x.device)
    return {"y": torch.where(owned[:, None], y, torch.zeros((), dtype=y.dtype, device=y.device)).to(x.dtype)}

"""The repository's one RMSNorm reference (Qwen3's, in HF and torchtitan), in torch.

``y = weight * (x * rsqrt(mean(x^2 over the last dim) + eps))``, in the order transformers'
``Qwen3RMSNorm`` computes it, in the dtype it is given (float64 for the truth; ``gradcheck``
runs on it; float32 in the parity reference, whose tolerances were measured so). No torchtitan
or transformers import. RMSNorm has no kernel in harness/kernels/ops: the kernel registry holds
torchtitan's and transformers' against this (harness/kernels/checks/references.py), and the
model reference (harness/references/model.py) normalises with it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x`` normalised over its last dim and scaled by ``weight``, in their promoted dtype."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

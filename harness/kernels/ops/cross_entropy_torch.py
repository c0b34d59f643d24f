"""The repository's one cross-entropy reference, in torch, written from the math.

The summed negative log-likelihood of ``labels (B, L)`` under ``logits (B, L, V)``:
``sum over kept positions of logsumexp(logits) - logits[label]``; a label equal to
``IGNORE_INDEX`` (torchtitan's and transformers' -100) contributes nothing. Labels are already
aligned with the logits (position t predicts labels[t]): no shift happens here. Computes in the
logits' dtype (float64 for the truth; ``gradcheck`` runs on it). No torch loss function, no
torchtitan or transformers import: the kernel registry holds torchtitan's loss and nki-library's
kernel against it (harness/kernels/checks/references.py). How the trainer normalises the sums of
its ranks is the loss contract (harness/references/loss.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE_INDEX = -100


def summed_cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """The summed token cross entropy over the labels that are not ``ignore_index``."""
    flat = logits.reshape(-1, logits.shape[-1])
    target = labels.reshape(-1)
    keep = target != ignore_index
    log_z = torch.logsumexp(flat[keep], dim=-1)
    picked = flat[keep].gather(-1, target[keep][:, None]).squeeze(-1)
    return (log_z - picked).sum()

"""The repository's one MoE router reference (Qwen3-MoE's top-k softmax routing), in torch.

Logits ``x @ gate_weight^T``, a softmax over the experts, the ``top_k`` most probable experts of
each token and, with ``renormalise``, their probabilities divided by their sum (Qwen3-MoE's
``norm_topk_prob``; torchtitan's ``route_norm``). Everything computes in the dtype it is given:
float64 for the truth (``gradcheck`` runs on it); the model reference (harness/references/
model.py) gives it float32, as Qwen3-MoE defines its router. No torchtitan or transformers
import. The router has no kernel in harness/kernels/ops: the kernel registry holds torchtitan's and
transformers' against this (harness/kernels/checks/references.py).

The order of the chosen experts is a parameter: ``by_value`` (descending probability,
``torch.topk`` sorted, the order transformers sums them in) or ``topk(sorted=False)``'s
(torchtitan's). The set, and so the math, is the same; the renormalising sum's rounding is not
(1 ulp of a routing weight with k > 2). ``ids`` pins the chosen experts instead (the set an
implementation chose where probabilities tie); the weights come in ``ids``' order.
"""

from __future__ import annotations

import torch
from torch import Tensor


def route(x: Tensor, gate_weight: Tensor, top_k: int, *, renormalise: bool = True,
          by_value: bool = True, ids: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(weights [T, K], expert ids [T, K], probabilities [T, E])`` for tokens ``x [T, D]`` and
    the gate ``gate_weight [E, D]``."""
    probs = torch.softmax(x @ gate_weight.transpose(0, 1), dim=-1)
    if ids is None:
        weights, ids = torch.topk(probs, top_k, dim=-1, sorted=by_value)
    else:
        weights = probs.gather(-1, ids)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids, probs

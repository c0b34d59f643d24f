"""torchtitan's loss contract, written once: how a training step's logged loss is made from its
ranks' batches.

Each dp rank's token cross entropy summed over its valid labels (those not ``IGNORE_INDEX``,
torchtitan's and transformers' ignored label: every stage above the kernels takes it from
here), computed as torchtitan's loss computes it (``F.cross_entropy`` on float32 logits,
reduction "sum"; the math itself, and where ``IGNORE_INDEX`` is defined:
harness/kernels/ops/cross_entropy_torch.py, against which the kernel registry holds torch's),
divided by the global count of valid labels, summed over the ranks: the ``global_avg_loss``
torchtitan 0.3.0 documents and logs; of one batch that is the whole step (the in-process
models of harness/parity, the diagnosis's one rank), ``avg_loss``. ``global_avg_loss``
accumulates in a dtype: float32 is the trainer's own arithmetic (the recorded fixture losses,
scripts/make_fixtures.py), float64 the independent forward's
(harness/checks/reference_forward.py, whose bands were measured so). ``LossParts`` holds one
step's parts with two wrong normalisations beside the right one, which a check must tell apart
(tests/e2e/test_ignored_labels.py). The batches the ranks dumped are read by
harness/references/batch.py ``load_batches``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.kernels.ops.cross_entropy_torch import IGNORE_INDEX


def rank_ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One rank's summed token cross entropy over its valid labels, as torchtitan computes it:
    ``logits (B, L, V)`` in float32 (float64 logits, a float64 reference's, stay float64),
    ``labels (B, L)`` already aligned with them (no shift)."""
    flat = logits.flatten(0, 1)
    flat = flat if flat.dtype == torch.float64 else flat.float()
    return F.cross_entropy(flat, labels.flatten(0, 1).to(flat.device), reduction="sum",
                           ignore_index=IGNORE_INDEX)


def avg_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss of one batch that is the whole step: its summed cross entropy over its valid
    labels divided by their count (``global_avg_loss`` of one rank; differentiable)."""
    return rank_ce_sum(logits, labels) / max(valid_labels([labels]), 1)


def valid_labels(labels: Iterable[torch.Tensor]) -> int:
    """The global count of valid (not ignored) labels over every rank's ``labels``."""
    return sum(int((rank_labels != IGNORE_INDEX).sum()) for rank_labels in labels)


def global_avg_loss(rank_ce_sums: Iterable[torch.Tensor | float], valid: int, *,
                    dtype: torch.dtype = torch.float32) -> float:
    """The logged loss: each rank's summed CE divided by the global ``valid`` count, summed over
    the ranks, in ``dtype`` (float32: the trainer's order and rounding)."""
    total = torch.zeros((), dtype=dtype)
    for ce_sum in rank_ce_sums:
        total += torch.as_tensor(ce_sum).to(dtype) / valid
    return total.item()


@dataclass
class LossParts:
    ce_sum: float  # summed CE over valid tokens, all ranks
    valid: int  # valid labels, all ranks
    total: int  # all labels, all ranks
    per_rank: list[tuple[float, int, int]]  # (ce_sum, valid, total) per rank

    @classmethod
    def of(cls, rank_ce_sums: list[torch.Tensor], labels: list[torch.Tensor]) -> LossParts:
        per_rank = [(float(ce), valid_labels([rank_labels]), rank_labels.numel())
                    for ce, rank_labels in zip(rank_ce_sums, labels, strict=True)]
        return cls(sum(c for c, _, _ in per_rank), sum(v for _, v, _ in per_rank),
                   sum(t for _, _, t in per_rank), per_rank)

    @property
    def global_avg(self) -> float:
        """torchtitan's contract (``global_avg_loss``, accumulated in float64)."""
        return global_avg_loss([c for c, _, _ in self.per_rank], self.valid, dtype=torch.float64)

    @property
    def all_token_avg(self) -> float:
        """A wrong normalisation: over every label, ignored ones included."""
        return self.ce_sum / self.total

    @property
    def mean_of_rank_means(self) -> float:
        """Another wrong one: each rank normalised by its own valid tokens, then averaged."""
        return sum(c / v for c, v, _ in self.per_rank) / len(self.per_rank)


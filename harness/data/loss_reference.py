"""An independent step-1 loss over the batches a run was fed: the HF model (transformers, float32)
on each rank's dumped batch, cross entropy summed over the tokens whose label is not -100, and
normalised the way torchtitan 0.3.0 documents ``global_avg_loss``: the sum over dp ranks of each
rank's summed token CE, divided by the global count of valid (non-ignored) labels."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


@dataclass
class LossParts:
    ce_sum: float  # summed CE over valid tokens, all ranks
    valid: int  # valid labels, all ranks
    total: int  # all labels, all ranks
    per_rank: list[tuple[float, int, int]]  # (ce_sum, valid, total) per rank

    @property
    def global_avg(self) -> float:
        """torchtitan's contract: sum of ranks' CE sums / global valid tokens."""
        return self.ce_sum / self.valid

    @property
    def all_token_avg(self) -> float:
        """A wrong normalisation: over every label, ignored ones included."""
        return self.ce_sum / self.total

    @property
    def mean_of_rank_means(self) -> float:
        """Another wrong one: each rank normalised by its own valid tokens, then averaged."""
        return sum(c / v for c, v, _ in self.per_rank) / len(self.per_rank)


def hf_loss_parts(model_dir: str | Path, batches: list[dict]) -> LossParts:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    per_rank = []
    with torch.no_grad():
        for batch in batches:
            tokens, labels = batch["model_input"], batch["model_labels"]
            positions = batch.get("model_positions")
            logits = model(input_ids=tokens, position_ids=positions).logits.float()
            ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum",
                                 ignore_index=IGNORE_INDEX)
            per_rank.append((float(ce), int((labels != IGNORE_INDEX).sum()), labels.numel()))
    return LossParts(sum(c for c, _, _ in per_rank), sum(v for _, v, _ in per_rank),
                     sum(t for _, _, t in per_rank), per_rank)

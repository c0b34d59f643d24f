"""How transformers' Qwen3 is asked to mask a packed row (transformers 5.x, as met).

Called with ``position_ids`` that restart at each document and no ``attention_mask`` (and no
cache), transformers detects the packing and masks causally within each document. An all-ones
2D ``attention_mask`` turns that detection off: causal over the whole row, at the positions
given. The two references of a run's masking (harness/parity/models.py ``load_hf`` and
harness/checks/reference_forward.py ``rank_ce_sums``) ask through this one function;
tests/parity/test_forward_parity.py holds transformers to it (the two maskings differ on packed
rows and each matches the independent reference's mask).
"""

from __future__ import annotations

import torch

# The maskings of a packed row whose positions restart per document, by what transformers needs.
PER_DOCUMENT = "document"  # no attention_mask: transformers' packed-sequence detection


def attention_mask(inputs: torch.Tensor, mask: str) -> torch.Tensor | None:
    """The ``attention_mask`` to pass with ``inputs`` for ``mask``: None for ``document``
    (causal within each document), all ones for any causal-over-the-row masking."""
    return None if mask == PER_DOCUMENT else torch.ones_like(inputs)

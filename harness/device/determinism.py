"""Checks that read memory upstream leaves uninitialised see the same bytes on every run.

``torch.empty`` (and ``empty_like``, ``empty_strided``, ``Module.to_empty``, a growing
``resize_``) hands out whatever the allocator reuses: often a freed tensor's values, so a
check of uninitialised memory would pass or fail depending on what ran before it. Under
deterministic algorithms with ``torch.utils.deterministic.fill_uninitialized_memory``
(PyTorch's own means) such memory is filled instead: NaN for floating point, the largest
value for integers. ``poisoned_uninitialised_memory()`` turns that on for one block and
restores the previous settings after it.

``primed_allocator(tensor)`` is the opposite, for the self-tests: it allocates a copy of
``tensor`` and frees it, so the next allocation of that size is likely to find its values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.utils.deterministic


@contextlib.contextmanager
def poisoned_uninitialised_memory() -> Iterator[None]:
    """Inside the block, uninitialised tensors hold NaN (floats) or the dtype's max (ints).

    Non-deterministic ops only warn here (``warn_only``): the block is about what memory
    holds, not about refusing ops."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=not enabled or warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def primed_allocator(like: torch.Tensor) -> None:
    """Allocate a copy of ``like`` (same size, dtype, device) and free it at once."""
    primer = like.detach().clone()
    del primer

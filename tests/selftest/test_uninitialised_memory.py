"""harness/device/determinism.py: checks of memory upstream leaves unwritten see the same bytes on
every run.

Specification:
- inside ``poisoned_uninitialised_memory()``, ``torch.empty`` and ``Module.to_empty`` give NaN
  (floating point) and the dtype's largest value (integers), whatever a freed tensor of the same
  size held (``primed_allocator``);
- after the block, the deterministic-algorithms settings are what they were before it.
"""

import torch
import torch.utils.deterministic

from harness.device.determinism import poisoned_uninitialised_memory, primed_allocator


def test_uninitialised_memory_is_poisoned_whatever_was_freed_before():
    correct = torch.linspace(1.0, 0.01, 24)
    for _ in range(20):
        primed_allocator(correct)
        with poisoned_uninitialised_memory():
            floats = torch.empty(24)
            ints = torch.empty(24, dtype=torch.int64)
            module = torch.nn.Module()
            module.register_buffer("inv_freq", torch.empty(24, device="meta"))
            module.to_empty(device="cpu")
        assert floats.isnan().all() and module.inv_freq.isnan().all()
        assert (ints == torch.iinfo(torch.int64).max).all()


def test_settings_are_restored_after_the_block():
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    with poisoned_uninitialised_memory():
        assert torch.are_deterministic_algorithms_enabled()
    assert (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory) == before
    torch.use_deterministic_algorithms(True)  # a caller that had them on, strictly, keeps them
    try:
        with poisoned_uninitialised_memory():
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])

"""torchtitan on CPU: answer the device-module calls the trainer makes.

Why: ``torchtitan.tools.utils`` picks its device at import with
``torch._utils._get_available_device_type() or "cuda"``. On a CPU-only host that is "cuda", so
the trainer calls ``torch.cuda.set_device`` and dies ("Found no NVIDIA driver"). Several
modules copy ``device_type``/``device_module`` at import, so the fix must land right after
``torchtitan.tools.utils`` executes and before anything imports from it (see ``boot``).

``CpuDeviceModule`` answers the calls torchtitan makes on ``device_module``; peak memory is
the process's peak resident set size, so the per-step records still carry a memory figure.
"""

from __future__ import annotations

import os
import platform
import resource
import types

SHIM_NAME = "cpu_device"


def _total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 0


def _peak_rss_bytes() -> int:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class CpuDeviceModule(types.SimpleNamespace):
    """The subset of the ``torch.cuda`` module API that torchtitan 0.3.0 calls."""

    def __init__(self) -> None:
        super().__init__(memory=types.SimpleNamespace(
            _record_memory_history=lambda *a, **k: None,
            _snapshot=lambda *a, **k: {},
        ))

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def set_device(device) -> None:
        return None

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def synchronize(device=None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def get_device_name(device=None) -> str:
        return f"cpu ({platform.processor() or platform.machine()})"

    @staticmethod
    def get_device_properties(device=None):
        return types.SimpleNamespace(name="cpu", total_memory=_total_memory_bytes())

    @staticmethod
    def memory_stats(device=None) -> dict[str, int]:
        peak = _peak_rss_bytes()
        return {
            "active_bytes.all.peak": peak,
            "reserved_bytes.all.peak": peak,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        # The kernel's peak RSS cannot be reset; the figure is the run's peak so far.
        return None


def patch_torchtitan_tools_utils(utils_module: types.ModuleType) -> None:
    """Point torchtitan's device globals at the CPU."""
    utils_module.device_type = "cpu"
    utils_module.device_module = CpuDeviceModule()
    utils_module.get_device_info = lambda: ("cpu", utils_module.device_module)

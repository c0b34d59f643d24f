"""Pinning pytest-xdist workers to distinct NeuronCores (used by tests/kernels/conftest.py)."""

from __future__ import annotations


def visible_cores_for_worker(worker_id: str | None, cores_per_worker: int = 1) -> str | None:
    """NEURON_RT_VISIBLE_CORES value for an xdist worker id ("gw3" -> "3"), None outside xdist."""
    if not worker_id or not worker_id.startswith("gw"):
        return None
    index = int(worker_id[2:])
    first = index * cores_per_worker
    return str(first) if cores_per_worker == 1 else f"{first}-{first + cores_per_worker - 1}"

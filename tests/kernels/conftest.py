"""Fixtures for the kernel conformance tests.

Neuron tests under pytest-xdist: each worker is pinned to its own NeuronCore(s) through
NEURON_RT_VISIBLE_CORES, derived from the xdist worker id (gw0 -> core 0, gw1 -> core 1, ...;
KERNEL_TESTS_CORES_PER_WORKER widens the range). It must be set before the Neuron runtime
initialises in the worker, i.e. before the worker's first Neuron tensor, which the autouse
fixture below guarantees for tests marked ``neuron`` as long as nothing earlier in the worker
touched the device.
"""

from __future__ import annotations

import os

import pytest

from harness.kernels.xdist import visible_cores_for_worker


@pytest.fixture(autouse=True)
def _pin_neuron_cores(request, monkeypatch):
    if request.node.get_closest_marker("neuron") is None:
        return
    cores = visible_cores_for_worker(
        os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("KERNEL_TESTS_CORES_PER_WORKER", "1"))
    )
    if cores is not None and "NEURON_RT_VISIBLE_CORES" not in os.environ:
        monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", cores)

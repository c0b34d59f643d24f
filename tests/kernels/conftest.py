"""Fixtures for the kernel conformance tests.

Neuron tests under pytest-xdist: each worker is pinned to its own NeuronCore(s) through
NEURON_RT_VISIBLE_CORES, derived from the xdist worker id (gw0 -> core 0, gw1 -> core 1, ...;
KERNEL_TESTS_CORES_PER_WORKER widens the range). It must be set before the Neuron runtime
initialises in the worker, i.e. before the worker's first Neuron tensor, which the autouse
fixture below guarantees for tests marked ``neuron`` as long as nothing earlier in the worker
touched the device.

The same tests run under the LNC the ranks use (``NEURON_LOGICAL_NC_CONFIG``, default "2" as in
harness.device.devices): ``nki.jit`` would otherwise compile for LNC 1 against neuronx-cc's LNC 2 on trn2
(NCC_EVRF066). See harness/kernels/checks/neuron_env.py.
"""

from __future__ import annotations

import pytest

from harness.kernels.checks.neuron_env import neuron_test_env


@pytest.fixture(autouse=True)
def _neuron_env(request, monkeypatch):
    if request.node.get_closest_marker("neuron") is None:
        return
    for name, value in neuron_test_env().items():
        monkeypatch.setenv(name, value)

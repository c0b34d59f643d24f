"""The environment in-process NKI kernel calls need: the same LNC as the launched ranks.

``nki.jit`` compiles a kernel for LNC 1 unless ``NEURON_LOGICAL_NC_CONFIG`` is set, while
neuronx-cc defaults to LNC 2 on trn2, and NKI 0.7 rejects the mismatch (NCC_EVRF066; Neuron
2.33 docs: nki.jit, "Using Logical NeuronCores (LNC) with NKI"). The ranks get
``NEURON_LOGICAL_NC_CONFIG`` from ``harness.device.devices.profile_for("neuron")`` (the caller's
value, default "2"); the neuron kernel tests (tests/kernels/conftest.py) set the same value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import harness.device.devices
from harness.kernels.checks.xdist import visible_cores_for_worker

LNC_VARIABLE = "NEURON_LOGICAL_NC_CONFIG"


def rank_lnc_default() -> str:
    """The LNC ``harness.device.devices`` gives the ranks when the caller sets none.

    harness.device.devices does not export it yet (the default "2" sits inside ``profile_for``); the
    ``NEURON_LNC_DEFAULT`` name is read when it exists."""
    return str(getattr(harness.device.devices, "NEURON_LNC_DEFAULT", "2"))


def neuron_kernel_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables to set for in-process NKI kernel calls: the ranks' LNC."""
    environ = os.environ if environ is None else environ
    return {LNC_VARIABLE: environ.get(LNC_VARIABLE, rank_lnc_default())}


def neuron_test_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Everything tests/kernels/conftest.py sets for a test marked ``neuron``: its xdist
    worker's NeuronCores (unless the caller chose them) and the ranks' LNC."""
    environ = os.environ if environ is None else environ
    env = {}
    cores = visible_cores_for_worker(environ.get("PYTEST_XDIST_WORKER"),
                                     int(environ.get("KERNEL_TESTS_CORES_PER_WORKER", "1")))
    if cores is not None and "NEURON_RT_VISIBLE_CORES" not in environ:
        env["NEURON_RT_VISIBLE_CORES"] = cores
    env.update(neuron_kernel_env(environ))
    return env

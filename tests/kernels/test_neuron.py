"""Neuron hardware checks (marker ``neuron``): the harness ops dispatch to the NKI kernels on
a 'neuron' device. Skipped, with what is missing, anywhere else. The numerical conformance of
the Neuron implementations is in test_conformance.py (devices 'neuron' and 'nki-sim')."""

from __future__ import annotations

import pytest
import torch

import harness.kernels.ops
from harness.kernels.checks.spec import device_status

pytestmark = pytest.mark.neuron


@pytest.fixture(autouse=True)
def _require_neuron():
    ok, reason = device_status("neuron")
    if not ok:
        pytest.skip(reason)


def test_nki_kernels_are_registered_for_the_neuron_device():
    assert harness.kernels.ops.NEURON_REGISTRATION["registered"], harness.kernels.ops.NEURON_REGISTRATION["reason"]
    assert set(harness.kernels.ops.NEURON_REGISTRATION["ops"]) == {"harness::rope", "harness::grouped_swiglu",
                                                         "harness::grouped_swiglu_backward"}


def test_rope_op_runs_on_neuron_and_keeps_dtype_and_shape():
    x = torch.randn(1, 4, 8, 128, dtype=torch.bfloat16).to("neuron")
    cos = torch.randn(4, 128).to("neuron")
    y = torch.ops.harness.rope(x, cos, cos)
    assert y.device.type == "neuron" and y.dtype == x.dtype and y.shape == x.shape

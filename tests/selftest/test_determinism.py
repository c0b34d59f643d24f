"""Seeded reruns are bit-identical on CPU (``debug.seed`` + ``debug.deterministic``), and a
run whose ranks start warm (forked from a zygote, harness/rank/warm_start.py) computes what its
cold rerun (plain torchrun workers) computes, for every backend.

This is what lets the harness compare a rerun bitwise; cross-backend and cross-device
comparisons are banded instead (different kernels and reduction orders).
"""

import pytest

from harness.checks import run_checks as checks
from harness.launch.run import RunSpec


# Slow tier (CI runs it on every submission): each rerun is a launch of ~20 s on 2 cores.
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf_v5", "titan_native", "nki_moe"])
def test_seeded_rerun_gives_bit_identical_losses(backend, backend_runs, steps, device_profile):
    if device_profile.kind != "cpu":
        pytest.skip("bitwise reruns are promised on CPU only")
    first = backend_runs.get(RunSpec(backend, init="pretrained", steps=steps, save_hf=True))
    rerun = backend_runs.get(RunSpec(backend, init="pretrained", steps=steps, save_hf=True,
                                     start="cold"))
    checks.completed_or_known(first, steps), checks.completed_or_known(rerun, steps)
    assert (first.started.get("warm"), rerun.started.get("cold")) == (first.nproc, rerun.nproc), (
        f"warm {first.started}, cold {rerun.started}")
    assert rerun.losses == first.losses, (  # zip(strict=False): the message only, the lengths are compared
        "seeded rerun differs:\n" + "\n".join(
            f"step {a.step}: {a.loss!r} vs {b.loss!r}" for a, b in zip(first.steps, rerun.steps, strict=False)))
    assert [s.grad_norm for s in rerun.steps] == [s.grad_norm for s in first.steps]

"""The CPU tier's backend runs, on a CUDA GPU (``pytest -m cuda``).

Same specification as tests/e2e/test_backend_runs.py; the device profile is CUDA's (nccl, one
rank per GPU, no CPU shims), so these runs exercise torchtitan's own device path.
"""

import pytest

from harness import checks, known_defects
from harness.backends import BACKENDS, model_name
from harness.devices import profile_for
from harness.expectations import ExpectationRegistry
from harness.launch import INITS, RunSpec
from harness.run_cache import RunCache

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="session")
def cuda_runs(tmp_path_factory) -> RunCache:
    return RunCache(profile_for("cuda"), tmp_path_factory.mktemp("cuda_runs"))


@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_run_meets_first_step_expectation(backend, init, cuda_runs, steps, request):
    for defect in known_defects.for_run(backend, init, "tiny"):
        request.applymarker(defect.xfail())
    nproc = min(2, cuda_runs.profile.ranks_per_node)
    run = cuda_runs.get(RunSpec(backend, init=init, steps=steps, nproc=nproc))
    problems = checks.run_completed(run, steps) + checks.losses_finite(run)
    expectation = ExpectationRegistry().get(backend, model_name(backend, "tiny"), init, "cuda")
    problems += checks.first_step_loss(run, expectation)
    assert not problems, checks.report(problems, run) + "\n" + run.log_tails()

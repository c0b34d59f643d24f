"""Each backend trains through torchtitan's real trainer (torchrun, 2 ranks) on the device.

Specification: for every backend and for random and pretrained initialisation,
- the run completes (exit 0, every step logged, none timed out),
- every loss is finite,
- the step-1 loss equals the registered expectation within its tolerance.
"""

import math

from harness.backends import model_name
from harness.expectations import ExpectationRegistry
from harness.results import RunFailed


def test_run_completes_every_step(tiny_run, steps):
    if not tiny_run.ok:
        raise RunFailed(tiny_run, "the backend run did not finish cleanly")
    assert [s.step for s in tiny_run.steps] == list(range(1, steps + 1)), tiny_run.describe()


def test_every_loss_is_finite(tiny_run):
    bad = [(s.step, s.loss) for s in tiny_run.steps if not math.isfinite(s.loss)]
    assert tiny_run.steps and not bad, f"non-finite losses (step, loss): {bad}\n{tiny_run.describe()}"


def test_first_step_loss_matches_expectation(tiny_run, backend, init, device_profile,
                                             expect_known_defects):
    expectation = ExpectationRegistry().get(
        backend, model_name(backend, "tiny"), init, device_profile.kind
    )
    assert tiny_run.steps, f"no step records\n{tiny_run.describe()}\n{tiny_run.log_tails()}"
    problem = expectation.check(tiny_run.steps[0].loss)
    assert problem is None, f"{problem}\n{tiny_run.describe()}"

"""Each backend trains through torchtitan's real trainer (torchrun, 2 ranks) on the device.

Specification: for every backend and for random and pretrained initialisation,
- the run completes (exit 0, every step logged, none timed out),
- every loss is finite,
- the step-1 loss equals the registered expectation within its tolerance.
"""

from harness import checks
from harness.backends import model_name
from harness.expectations import ExpectationRegistry
from harness.results import RunFailed


def test_run_completes_every_step(tiny_run, steps):
    problems = checks.run_completed(tiny_run, steps)
    if problems:
        raise RunFailed(tiny_run, checks.report(problems, tiny_run))


def test_every_loss_is_finite(tiny_run):
    problems = checks.losses_finite(tiny_run)
    assert not problems, checks.report(problems, tiny_run)


def test_first_step_loss_matches_expectation(tiny_run, backend, init, device_profile,
                                             expect_known_defects):
    expectation = ExpectationRegistry().get(
        backend, model_name(backend, "tiny"), init, device_profile.kind
    )
    problems = checks.first_step_loss(tiny_run, expectation)
    assert not problems, checks.report(problems, tiny_run)

"""The checks of a launched run, written once and instantiated for every device tier.

Specification, for every backend of the registry (harness/backends), every init its size
offers, on every device of its tier (cpu: tiny; cuda: tiny; neuron: tiny and full size):
- the run completes: exit 0, no timeout, every step logged;
- every loss and grad norm is finite;
- the step-1 loss equals the registered expectation (fixtures/expectations.toml) within its
  loss band (harness/tolerances.py);
- the HF checkpoint it saves after the last step reloads with transformers with no missing,
  unexpected or mis-shaped key.
A known upstream defect (harness/known_issues.py) is accepted only where it applies and only
when the check fails exactly as recorded.
"""

import pytest

from harness import checks

CHECKS = list(checks.RUN_CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_run(launched_run, check, steps):
    checks.enforce(check, launched_run, steps)

"""Cases for tests/selftest/test_parallel_tier.py's own ``-n 2`` session (not collected by
the suite: the file name is not test_*.py): four tests on two workers need one run."""

import pytest

from harness.launch.run import RunSpec


@pytest.mark.parametrize("reader", range(4))
def test_reads_the_shared_run(backend_runs, reader):
    assert backend_runs.get(RunSpec("titan_native", init="pretrained", steps=1)).ok

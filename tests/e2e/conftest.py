import pytest

from harness import known_defects
from harness.backends import BACKENDS
from harness.launch import INITS, RunSpec


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every e2e test taking ``backend``/``init`` runs for each backend and each init."""
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", BACKENDS)
    if "init" in metafunc.fixturenames:
        metafunc.parametrize("init", INITS)


@pytest.fixture
def tiny_run(backend_runs, backend, init, steps, workarounds):
    """The shared 2-rank tiny run of this backend/init (launched once per session)."""
    return backend_runs.get(
        RunSpec(backend=backend, init=init, steps=steps, save_hf=True, workarounds=workarounds)
    )


@pytest.fixture
def expect_known_defects(request, backend, init, workarounds):
    """Mark the test a strict xfail naming each confirmed upstream defect that applies."""
    for defect in known_defects.for_run(backend, init, "tiny", workarounds):
        request.applymarker(defect.xfail())

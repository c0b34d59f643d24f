import pytest

from harness import known_defects
from harness.backends import BACKENDS
from harness.launch import INITS, RunSpec


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """An e2e test taking ``backend``/``init`` runs for each backend and each init, unless it
    parametrizes them itself."""
    own = {name for mark in metafunc.definition.iter_markers("parametrize")
           for name in (mark.args[0].split(",") if isinstance(mark.args[0], str) else mark.args[0])}
    if "backend" in metafunc.fixturenames and "backend" not in own:
        metafunc.parametrize("backend", BACKENDS)
    if "init" in metafunc.fixturenames and "init" not in own:
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

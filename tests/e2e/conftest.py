"""The run template's instantiation: one parameter per RunCase (device x backend x size x
attention x init), marked with its device tier; the runs themselves are shared per session.

Full-size runs read their assets under ``--assets-dir`` (harness/registry/assets_twin.py); on CPU that
root is the assets twin, laid out from the committed tiny fixtures once per session."""

import sys
from pathlib import Path

import pytest

from harness.backends import BACKENDS
from harness.device.devices import TIER_MARKERS, detect
from harness.launch.run_cache import shared_folder
from harness.launch.run_matrix import SubjectCase, cases
from harness.launch.subjects import Subject
from harness.registry.assets_twin import DENSE_ASSETS, build_twin, download_command, missing_dense_assets
from harness.registry.expectations import ExpectationRegistry
from harness.registry.layouts import FSDP


def _param(case):
    marks = [getattr(pytest.mark, TIER_MARKERS[case.device])] if case.device in TIER_MARKERS else []
    if case.slow:
        marks.append(pytest.mark.slow)
    return pytest.param(case, id=case.id, marks=marks)


def _subject_cases(config: pytest.Config) -> list:
    """``--subject M:C``: a user's config function, on the device this machine has."""
    folders = tuple(str(Path(p).resolve()) for p in (config.getoption("--subject-path") or ["."]))
    for folder in folders:
        if folder not in sys.path:
            sys.path.insert(0, folder)
    device = config.getoption("--device") or detect().kind
    return [SubjectCase(device, Subject.parse(text), folders) for text in config.getoption("--subject")]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "run_case" in metafunc.fixturenames:
        params = [_param(c) for c in cases()]
        params += [pytest.param(c, id=c.id) for c in _subject_cases(metafunc.config)]
        metafunc.parametrize("run_case", params, scope="session")
    if "published_case" in metafunc.fixturenames:
        params = [_param(c) for c in cases() if _published(c)]
        metafunc.parametrize("published_case", params, scope="session")


def _published(case) -> bool:
    """Whether the source published a number for this run, on the data the run reads, on the
    device it runs on (its stand-in in the rehearsal: the CPU twin's recorded stand-ins), in
    the source's layout (FSDP over every rank: another layout reads other rows per step)."""
    if case.layout != FSDP:
        return False

    model = BACKENDS[case.backend].size(case.size).model
    return any((e["backend"], e["model"], e["init"], e["device"], e["data"])
               == (case.backend, model, case.init, case.runs_on, case.data)
               for e in ExpectationRegistry().published_entries)


def full_size_assets(pytestconfig) -> Path:
    """The --assets-dir of the real full-size runs; a skip naming the download when absent."""
    root = pytestconfig.getoption("--assets-dir")
    if root is None:
        pytest.skip(f"--assets-dir not given; fetch the assets with: {download_command('<assets-dir>')}")
    missing = missing_dense_assets(root)
    if missing:
        pytest.skip(f"{Path(root) / DENSE_ASSETS} lacks {missing}; fetch the assets with: "
                    f"{download_command(root)} (the nightly: scripts/nightly/fetch_data.py)")
    return Path(root)


# Both folders go into the RunSpecs of the full-size runs, so they are the session's, not a
# worker's (harness/launch/run_cache.py shared_folder): per-worker copies made each worker that reads a
# full-size run launch it again (found by the random-order sweep: 19 launches for 16 runs).
@pytest.fixture(scope="session")
def assets_twin(tmp_path_factory) -> Path:
    """The full-size assets tree of the tiny fixtures (harness/registry/assets_twin.py), one per session."""
    return shared_folder(tmp_path_factory, "assets_twin", build_twin)


@pytest.fixture(scope="session")
def derived_assets_root(tmp_path_factory) -> Path:
    """Where assets folders the harness derives (the MoE's own) are built, once per session."""
    return shared_folder(tmp_path_factory, "derived_assets", lambda path: path.mkdir())


def _launch(case, device_runs, steps, workarounds, pytestconfig, request, tmp_path_factory):
    assets = workdir = None
    if getattr(case, "size", "") == "full":
        twin = getattr(case, "twin", False)
        assets = request.getfixturevalue("assets_twin") if twin else full_size_assets(pytestconfig)
        workdir = request.getfixturevalue("derived_assets_root")
    if isinstance(case, SubjectCase):
        return device_runs(case.device).get(case.run_spec(steps, assets, workarounds))
    spec = case.suite_spec(steps, assets, workarounds, workdir=workdir,
                           data_path=pytestconfig.getoption("--c4-path"))
    return device_runs(case.device).get(spec)


@pytest.fixture(scope="session")
def run_steps(run_case, steps) -> int:
    """How many steps ``run_case``'s run takes in this suite (harness/launch/run_matrix.py
    ``RunCase.suite_steps``: ``--steps``, fewer where nothing reads past the first steps)."""
    return run_case.suite_steps(steps) if hasattr(run_case, "suite_steps") else steps


@pytest.fixture(scope="session")
def published_steps(published_case, steps) -> int:
    return published_case.suite_steps(steps)


@pytest.fixture(scope="session")
def launched_run(run_case, device_runs, steps, workarounds, pytestconfig, request, tmp_path_factory):
    """The run of ``run_case``, launched once per session on its device. A full-size run's
    checkpoints go once every check that reads them has recorded its verdict (harness/checks/run_checks.py
    ``release_checkpoints``; ``HARNESS_KEEP_CHECKPOINTS=1`` keeps them), in whichever process
    and order the checks run."""
    return _launch(run_case, device_runs, steps, workarounds, pytestconfig, request, tmp_path_factory)


@pytest.fixture(scope="session")
def published_run(published_case, device_runs, steps, workarounds, pytestconfig, request,
                  tmp_path_factory):
    """The same run as ``launched_run`` of the case (one launch per session serves both)."""
    return _launch(published_case, device_runs, steps, workarounds, pytestconfig, request,
                   tmp_path_factory)

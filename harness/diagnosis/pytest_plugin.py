"""pytest's side of the report and the baseline (registered by the root conftest.py).

- ``--run-report DIR``: at the end of the session, the report folder of every run the session
  launched (summary.md, results.json, junit.xml, loss_curves.png: harness/report.py), each run
  checked as the main job checks it; the nightly keeps it as the next night's baseline.
- ``--baseline PATH`` (a previous report folder or its results.json): every launched run of
  the run template is compared with the same run there (``test_vs_baseline`` in
  tests/e2e/test_runs_vs_baseline.py, deselected without the option), and the session's
  report gets the "vs baseline" column and section.
"""

from __future__ import annotations

from pathlib import Path

import pytest

RUN_CACHES = pytest.StashKey[dict]()  # device kind -> RunCache, set by the device_runs fixture
BASELINE_FIXTURE = "baseline_document"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness")
    group.addoption("--baseline", default=None, metavar="PATH",
                    help="a previous report folder (or its results.json): compare every run "
                    "with the same run there")
    group.addoption("--run-report", default=None, metavar="DIR",
                    help="write the report folder of every run this session launched to DIR")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--baseline")
    if path:
        from harness.diagnosis import baseline

        try:
            config.stash[_BASELINE] = baseline.load(path)
        except baseline.BaselineError as error:
            raise pytest.UsageError(str(error)) from None


_BASELINE = pytest.StashKey[dict]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--baseline"):
        return
    dropped = [i for i in items if BASELINE_FIXTURE in getattr(i, "fixturenames", ())]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


@pytest.fixture(scope="session")
def baseline_document(pytestconfig: pytest.Config) -> dict:
    return pytestconfig.stash[_BASELINE]


def header() -> dict[str, str]:
    from harness.cli import code_commit
    from harness.launch import package_versions

    return {"commit": code_commit(), **{f"version {k}": v for k, v in package_versions().items()}}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = session.config.getoption("--run-report")
    caches = session.config.stash.get(RUN_CACHES, {})
    runs = [run for cache in caches.values() for run in cache.results()]
    if not out or not runs:
        return
    from harness import checks
    from harness.diagnosis import baseline as baseline_module
    from harness.report import RunVerdict, results_document, write_report

    steps = session.config.getoption("--steps")
    # each run is judged by the steps its own command asked for: the suite shortens some
    # (harness/run_matrix.py RunCase.suite_steps) and resumes others from a checkpoint
    verdicts = [RunVerdict(run, checks.verdicts(run, run.planned_steps or steps)) for run in runs]
    head = {"device": ", ".join(sorted(caches)), "steps": str(steps), **header()}
    base = session.config.stash.get(_BASELINE, None)
    compared = (baseline_module.compare(results_document(verdicts, head), base,
                                        session.config.getoption("--baseline"))
                if base is not None else None)
    write_report(verdicts, Path(out).resolve(), head, compared, base)

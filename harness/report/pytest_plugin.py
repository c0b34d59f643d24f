"""pytest's side of the report and the baseline (registered by the root conftest.py).

- ``--run-report DIR``: at the end of the session, the report folder of every run the session
  launched (summary.md, results.json, junit.xml, loss_curves.png: harness/report/run_report.py), with the
  verdicts its tests computed (harness/checks/run_checks.py ``record``); the nightly keeps it as the next
  night's baseline.
- ``--baseline PATH`` (a previous report folder or its results.json): every launched run of
  the run template is compared with the same run there (``test_vs_baseline`` in
  tests/e2e/test_runs_vs_baseline.py, deselected without the option), and the session's
  report gets the "vs baseline" column and section.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.launch.run_cache import session_root, stored_results
from harness.report import baseline
from harness.report import baseline as baseline_module
from harness.upstream.versions import code_commit, package_versions

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
    return {"commit": code_commit(), **{f"version {k}": v for k, v in package_versions().items()}}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Once per session (xdist's controller, or the only process): the report of every run any
    process of the session launched, with the verdicts their tests recorded."""
    out = session.config.getoption("--run-report")
    if not out or hasattr(session.config, "workerinput"):
        return

    runs = stored_results(session_root(session.config._tmp_path_factory))
    if runs:
        write_session_report(runs, Path(out).resolve(), session.config.getoption("--steps"),
                             session.config.stash.get(_BASELINE, None),
                             session.config.getoption("--baseline"))


def write_session_report(runs, out: Path, steps: int, base: dict | None = None,
                         base_source: str | None = None) -> Path:
    """The report folder of ``runs`` with the verdicts their tests recorded (harness/checks/run_checks.py
    ``record``), never judged again here: by now a full-size run's checkpoints are gone, and a
    check the session did not select has no verdict (the report says so). Then the session is
    over for every checkpoint too."""
    from harness.checks import run_checks as checks  # noqa: PLC0415  heavy: torch; every pytest session loads this plugin
    from harness.report.run_report import RunVerdict, results_document, write_report  # noqa: PLC0415  heavy: torch; every pytest session loads this plugin

    verdicts = [RunVerdict(run, checks.recorded(run)) for run in runs]
    head = {"device": ", ".join(sorted({_device(run) for run in runs})), "steps": str(steps),
            **header()}
    compared = (baseline_module.compare(results_document(verdicts, head), base, base_source or "")
                if base is not None else None)
    write_report(verdicts, out, head, compared, base)
    for run in runs:
        checks.release_checkpoints(run, readers_done=True)
    return out


def _device(run) -> str:
    standin = run.versions.get("standin-for")
    return f"{run.device} (standing in for {standin})" if standin else run.device

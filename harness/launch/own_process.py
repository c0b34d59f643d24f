"""Tests marked ``own_process`` run in a child pytest process, never in the session's (a plugin).

Why: the Neuron runtime reserves every NeuronCore for the first process that initialises it
(the Neuron 2.33 docs; torch-neuronx assigns cores per rank only to processes that start
without them). A test that touches the 'neuron' torch device in the pytest process would leave
the cores with that process, and every torchrun the session launches afterwards would find none:
which test ran first would decide the night. So a test of a device in process (the root
conftest marks every such tier test) runs in a ``python -m pytest <nodeids>`` child, whose
runtime is released when it exits, whatever the order or the selection.

The marked tests of one module run together in one child, started when the first of them is
reached (a child costs an import of torch and the device's stack; the nightly's 73 kernel cells
would pay it 73 times); under pytest-xdist each test gets its own. The child runs with the
parent's harness options (the "harness" option group, as given), under a time limit of
``CHILD_TIMEOUT_PER_TEST_S`` per test, and carries the session's marker
(harness/registry/environment.py ``child_environment``) so the end-of-session sweep finds it if
it outlives its tests. Its reports
(setup, call, teardown) come back serialised through pytest's own
``pytest_report_to_serializable``, so the parent reports pass, fail, skip and xfail exactly as
the child saw them; a test the child never reported fails, with the child's last lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.device import devices
from harness.registry import environment

MARKER = "own_process"
_CONFIG: list[pytest.Config] = []  # this process's config (the child serialises with it)
# A cold NKI compile of one kernel case on trn2 takes a minute or two (its kernels, its torch
# reference on the host); a child gets this long per test it runs, collection included (the
# nightly's budget counts it: scripts/nightly/budget.py).
CHILD_TIMEOUT_PER_TEST_S = 3 * 60
_REPORTS = pytest.StashKey[dict]()  # nodeid -> the reports a child gave for it


# The fixtures through which a test reads launched runs; a tier test without any of them runs
# on its device in the pytest process itself.
RUN_FIXTURES = ("launched_run", "published_run", "device_runs", "backend_runs")
_DESELECTED = pytest.StashKey[list]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The in-process tests of a tier whose runtime is exclusive (harness/device/devices.py
    ``EXCLUSIVE_RUNTIME``) run in a child; on a stand-in (the rehearsal) they are deselected,
    and the session's summary says why: the stand-in is a profile for launches, not a device."""
    for kind in devices.TIER_MARKERS:
        in_process = [i for i in items if i.get_closest_marker(kind)
                      and not set(RUN_FIXTURES) & set(getattr(i, "fixturenames", ()))]
        if not in_process:
            continue
        if devices.standin_for(kind):
            config.hook.pytest_deselected(items=in_process)
            items[:] = [i for i in items if i not in in_process]
            config.stash.setdefault(_DESELECTED, []).append(
                f"{len(in_process)} in-process test(s) of the '{kind}' device deselected: the "
                f"{kind} tier runs on a stand-in ({devices.tier_status(kind)[1]}), which has no "
                f"'{kind}' torch device")
        elif kind in devices.EXCLUSIVE_RUNTIME and devices.tier_status(kind)[0]:
            for item in in_process:
                item.add_marker(pytest.mark.own_process)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    for line in config.stash.get(_DESELECTED, []):
        terminalreporter.write_line(f"harness: {line}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: runs in a child pytest process of its own "
                            "(harness/launch/own_process.py)")
    _CONFIG[:] = [config]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem) -> bool | None:
    if item.get_closest_marker(MARKER) is None or os.environ.get(environment.OWN_PROCESS_REPORTS):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _reports_of(item):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the child: every report of its test, serialised for the parent."""
    path = os.environ.get(environment.OWN_PROCESS_REPORTS)
    if not path or not getattr(report, "when", None):
        return
    config = _CONFIG[0]
    data = config.hook.pytest_report_to_serializable(config=config, report=report)
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(data) + "\n")


def harness_options(config: pytest.Config) -> list[str]:
    """The command-line form of every harness option given a value other than its default."""
    args: list[str] = []
    for option in config._parser.getgroup("harness").options:
        value, default = config.getoption(option.dest), option.attrs().get("default")
        if value == default or value is None:
            continue
        flag = option.names()[-1]
        if value is True:
            args.append(flag)
        elif isinstance(value, list):
            args += [f"{flag}={v}" for v in value]
        else:
            args.append(f"{flag}={value}")
    return args


def group_of(item: pytest.Item) -> list[pytest.Item]:
    """The marked tests that run in ``item``'s child: its module's (just ``item`` under xdist,
    whose workers each run a share of them)."""
    if hasattr(item.config, "workerinput"):
        return [item]
    return [i for i in item.session.items
            if i.get_closest_marker(MARKER) is not None and i.path == item.path]


def _reports_of(item: pytest.Item) -> list[pytest.TestReport]:
    done = item.config.stash.setdefault(_REPORTS, {})
    if item.nodeid not in done:
        group = group_of(item)
        done.update(run_in_child(group))
    return done.pop(item.nodeid)


def child_command(items: list[pytest.Item]) -> list[str]:
    config = items[0].config
    return [sys.executable, "-m", "pytest", *(i.nodeid for i in items), "-p", "no:cacheprovider",
            "-o", "addopts=", "-q", "--rootdir", str(config.rootpath), "-p", "no:randomly",
            *harness_options(config)]


def run_in_child(items: list[pytest.Item]) -> dict[str, list[pytest.TestReport]]:
    """Every report of ``items``, run in one child pytest process, by nodeid."""
    config = items[0].config
    timeout_s = CHILD_TIMEOUT_PER_TEST_S * len(items)
    with tempfile.TemporaryDirectory(prefix="own_process_") as folder:
        reports_file, log = Path(folder) / "reports.jsonl", Path(folder) / "child.log"
        env = environment.child_environment(**{environment.OWN_PROCESS_REPORTS: str(reports_file)})
        env.pop("PYTEST_XDIST_WORKER", None)
        with open(log, "wb") as out:
            try:
                code = subprocess.run(child_command(items), cwd=config.invocation_params.dir,
                                      env=env, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                code = None
        lines = reports_file.read_text().splitlines() if reports_file.is_file() else []
        by_test: dict[str, list[pytest.TestReport]] = {i.nodeid: [] for i in items}
        for line in lines:
            report = _report(config, json.loads(line))
            by_test.setdefault(report.nodeid, []).append(report)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    why = f"no answer within {timeout_s:.0f} s" if code is None else f"exit {code}"
    for item in items:
        reports = by_test[item.nodeid]
        if not any(r.when == "call" or r.outcome != "passed" for r in reports):
            reports.append(_failed(item, f"own_process: the child pytest process ({why}) gave no "
                                         f"report of {item.nodeid}:\n{tail}"))
    return by_test


def _report(config: pytest.Config, data: dict) -> pytest.TestReport:
    report = config.hook.pytest_report_from_serializable(config=config, data=data)
    if report.skipped and isinstance(report.longrepr, list):  # JSON made the (path, line, reason) a list
        report.longrepr = tuple(report.longrepr)
    return report


def _failed(item: pytest.Item, text: str) -> pytest.TestReport:
    return pytest.TestReport(item.nodeid, item.location, {}, "failed", text, "call", [])

"""A test marked ``own_process`` runs in a child pytest process of its own, and its outcome is
the child's (harness/launch/own_process.py): what keeps an in-process test of the 'neuron' device from
taking every NeuronCore from the runs the pytest process launches, whatever the order.

Specification, on a suite of its own (pytester, in a subprocess as a user runs pytest):
- the marked tests of a module run together in one child process, not the session's; unmarked
  tests run in the session;
- pass, fail (with the child's assertion text), skip and xfail come back as the child saw them;
- a test the child never reported (it died) is a failure naming the test and showing why;
- the harness options given to the parent reach the child.
"""

from __future__ import annotations

import os

from harness.device import devices
from harness.registry import environment

pytest_plugins = ("pytester",)

SUITE = '''
import os

import pytest


def _note_pid():
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")


@pytest.mark.own_process
def test_passes_with_the_parents_option(pytestconfig):
    _note_pid()
    assert pytestconfig.getoption("--steps") == 7


@pytest.mark.own_process
def test_fails():
    _note_pid()
    assert 1 + 1 == 3, "the child's own assertion message"


@pytest.mark.own_process
def test_skips():
    pytest.skip("skipped in the child")


@pytest.mark.own_process
def test_xfails():
    pytest.xfail("expected in the child")


@pytest.mark.own_process
def test_dies():
    os._exit(3)


def test_unmarked_runs_in_the_session():
    _note_pid()
'''

CONFTEST = '''
pytest_plugins = ("harness.launch.own_process",)


def pytest_addoption(parser):
    parser.getgroup("harness").addoption("--steps", type=int, default=10)
'''


def test_marked_tests_run_each_in_a_child_and_report_as_it_saw_them(pytester, tmp_path, monkeypatch):
    pids = tmp_path / "pids.txt"
    monkeypatch.setenv("PIDS_FILE", str(pids))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=", "-rA",
                                           "-p", "no:randomly", "--steps=7")
    result.assert_outcomes(passed=2, failed=2, skipped=1, xfailed=1)
    text = result.stdout.str()
    assert "the child's own assertion message" in text
    assert "skipped in the child" in text and "expected in the child" in text
    assert ("own_process: the child pytest process (exit 3) gave no report of "
            "test_suite.py::test_dies") in text
    marked_one, marked_two, session = [int(line) for line in pids.read_text().split()]
    assert marked_one == marked_two != session, (marked_one, marked_two, session)


TIER_SUITE = '''
import os

import pytest


@pytest.fixture
def launched_run():
    return "a run"


def _note(kind):
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{kind} {os.getpid()}\\n")


@pytest.mark.neuron
def test_on_the_device_in_process():
    _note("in_process")


@pytest.mark.neuron
def test_reads_a_launched_run(launched_run):
    _note("launch")
'''


def _tier_session(pytester, tmp_path, monkeypatch):
    pids = tmp_path / "tier_pids.txt"
    monkeypatch.setenv("PIDS_FILE", str(pids))
    monkeypatch.setattr(devices, "tier_status", lambda kind: (kind == "neuron", "patched"))
    pytester.makeini("[pytest]\nmarkers =\n    neuron: the neuron tier\n")
    pytester.makeconftest('pytest_plugins = ("harness.launch.own_process",)\n')
    pytester.makepyfile(test_tier=TIER_SUITE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-rA")
    seen = dict(line.split() for line in pids.read_text().splitlines()) if pids.is_file() else {}
    return result, {k: int(v) for k, v in seen.items()}, os.getpid()


def test_a_neuron_test_on_the_device_in_process_runs_in_a_child_and_one_reading_runs_does_not(
        pytester, tmp_path, monkeypatch):
    monkeypatch.delenv(environment.NEURON_STANDIN, raising=False)
    result, pids, session = _tier_session(pytester, tmp_path, monkeypatch)
    result.assert_outcomes(passed=2)
    assert pids["launch"] == session and pids["in_process"] != session, (pids, session)


def test_on_a_stand_in_the_in_process_neuron_tests_are_deselected_and_named(
        pytester, tmp_path, monkeypatch):
    monkeypatch.setenv(environment.NEURON_STANDIN, "cpu")
    result, pids, session = _tier_session(pytester, tmp_path, monkeypatch)
    result.assert_outcomes(passed=1, deselected=1)
    assert list(pids) == ["launch"]
    result.stdout.fnmatch_lines(["harness: 1 in-process test(s) of the 'neuron' device deselected:*"])

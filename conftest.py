"""Root pytest configuration: device tiers, the one workaround option, shared backend runs.

Data flows one way: the device profile -> launches (one per distinct RunSpec per session and
device, shared through ``device_runs`` by every test and every xdist worker) -> results -> the
checks in tests/.
"""

from __future__ import annotations

import fnmatch
import os

import psutil
import pytest

from harness.rank import startup_gc

# Collection off over this process's imports (torch, torchtitan, transformers: the suite's
# collection), back on frozen once the tests are collected (harness/rank/startup_gc.py).
startup_gc.pause()

from harness.device.devices import (  # noqa: E402
    KINDS,
    THREADS_ENV,
    TIER_MARKERS,
    detect,
    profile_for,
    standin_for,
    tier_status,
    worker_threads,
    xdist_workers,
)
from harness.launch import prefetch, warm  # noqa: E402
from harness.launch.children import leftover_processes  # noqa: E402
from harness.launch.run import RunSpec, rank_environment  # noqa: E402
from harness.launch.run_cache import RunCache, repeated_launches, session_root, unread_prefetches  # noqa: E402
from harness.registry import dump_layout, environment, known_issues  # noqa: E402

# --baseline and --run-report (tonight against a previous report): harness/diagnosis; a tier's
# in-process device tests in child processes, or deselected on a stand-in: harness/launch/own_process.py.
pytest_plugins = ("harness.report.pytest_plugin", "harness.launch.own_process")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness")
    group.addoption("--device", choices=KINDS, default=None,
                    help="device of the self-tests' runs (default: neuron > cuda > cpu, first "
                    "present); the run template runs every device of its tiers")
    group.addoption("--steps", type=int, default=10, help="training steps per backend run (on "
                    "CPU the tiny MoE's random-init run takes 3: harness/launch/run_matrix.py)")
    group.addoption("--assets-dir", default=None,
                    help="directory holding HF assets dirs (e.g. <dir>/Qwen3-4B-Instruct-2507)")
    group.addoption("--workaround", **known_issues.WORKAROUND_OPTION)
    group.addoption("--torchrun-arg", action="append", default=[], metavar="ARG",
                    help="torchrun rendezvous option replacing --standalone, repeatable; for "
                    "multi-node runs, e.g. --torchrun-arg=--nnodes=2 "
                    "--torchrun-arg=--rdzv-backend=c10d --torchrun-arg=--rdzv-endpoint=HOST:29500 "
                    "--torchrun-arg=--rdzv-id=$RUN_ID (a fresh id per session)")
    group.addoption("--subject", action="append", default=[], metavar="M:C",
                    help="also run and check a torchtitan config function (--module M --config C) "
                    "on this machine's device, repeatable; its module is imported from "
                    "--subject-path (default: the current folder)")
    group.addoption("--subject-path", action="append", default=[],
                    help="folder holding the --subject modules, repeatable")
    group.addoption("--no-prefetch", action="store_true",
                    help="launch each run only when a test reads it (default on CPU: the runs the "
                    "collected tests read also launch ahead of need, harness/launch/prefetch.py)")
    group.addoption("--trn2-runner", action="store_true",
                    help="nightly Trainium runners: any skip, or an empty selection, fails")
    group.addoption("--c4-path", default=os.environ.get(environment.C4_PATH), metavar="DIR",
                    help="a local copy of allenai/c4 (its README.md and en/ shards, harness/backends/"
                    "c4.py) for the full-size runs; default $HARNESS_C4_PATH, else the Hub (the "
                    "CPU twin reads fixtures/c4). Fetch one with scripts/nightly/fetch_data.py")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the default, pyproject.toml): harness.device.devices.xdist_workers decides."""
    return xdist_workers(config.getoption("--device"), config.option.markexpr, os.cpu_count())


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker's torch, and the processes its tests start, get the worker's
    share of the cores (harness.device.devices.worker_threads)."""
    threads = worker_threads(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")), os.cpu_count())
    if threads is not None:
        import torch  # noqa: PLC0415  heavy: torch; every pytest session loads conftest

        torch.set_num_threads(threads)
        os.environ[THREADS_ENV] = str(threads)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tier tests whose device is missing, naming what is missing; skip the tests the
    installed torchtitan generation has not been ported to, naming why (harness/upstream/titan_api)."""
    from harness.upstream import titan_api  # noqa: PLC0415  heavy: torchtitan; every pytest session loads conftest

    for pattern, why in titan_api.NOT_PORTED:
        skip = pytest.mark.skip(reason=f"not ported to torchtitan {titan_api.generation()}: {why}")
        for item in items:
            if fnmatch.fnmatch(item.nodeid, pattern):
                item.add_marker(skip)
    for kind in TIER_MARKERS.values():
        available, reason = tier_status(kind)
        if available:
            continue
        skip = pytest.mark.skip(reason=f"{kind} tier: {reason}")
        for item in items:
            if item.get_closest_marker(kind):
                item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"{kind} tier: {tier_status(kind)[1]}" for kind in TIER_MARKERS if standin_for(kind)]


def pytest_sessionstart(session: pytest.Session) -> None:
    if session.config.pluginmanager.has_plugin("dsession"):  # xdist's controller collects nothing
        startup_gc.resume_frozen()


def pytest_collection_finish(session: pytest.Session) -> None:
    startup_gc.resume_frozen()
    _prestart_the_zygote(session)
    _start_the_prefetcher(session)
    if session.config.getoption("--trn2-runner") and not session.items:
        raise pytest.UsageError("--trn2-runner: the selection collected no test")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.config.getoption("--trn2-runner") and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"--trn2-runner forbids skips; this test skipped: {reason}"


def _prestart_the_zygote(session: pytest.Session) -> None:
    """Where this process will launch CPU runs, its zygote (harness/launch/warm.py) starts
    importing now, beside the session's first tests, not when its first run launches."""
    if session.config.getoption("collectonly") or not any(
            {"device_runs", "backend_runs"} & set(getattr(item, "fixturenames", ()))
            for item in session.items):
        return
    try:
        profile = detect(session.config.getoption("--device"))
    except RuntimeError:  # a device not here: its tests say so themselves
        return
    if profile.warm_start:
        warm.prestart(rank_environment(RunSpec("titan_native"), profile), profile.shims)


def _start_the_prefetcher(session: pytest.Session) -> None:
    """Where the device allows it, the runs this session's tests will read start launching
    ahead of need, in one process of the session (harness/launch/prefetch.py)."""
    global _PREFETCHER
    config = session.config
    # Nodes of a multi-node session launch the same runs in the same order (their rendezvous):
    # a run launched ahead of its turn on one node would wait for the others.
    if (config.getoption("collectonly") or config.getoption("--no-prefetch")
            or config.getoption("--torchrun-arg")):
        return
    try:
        profile = detect(session.config.getoption("--device"))
    except RuntimeError:
        return
    if not profile.prefetch:
        return

    specs = prefetch.needed_specs(session.items, profile.kind, config.getoption("--steps"),
                                  tuple(config.getoption("--workaround")))
    root = dump_layout.runs_folder(session_root(config._tmp_path_factory), profile.kind)
    _PREFETCHER = prefetch.start(root, profile.kind, specs)


_PREFETCHER = None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.getoption("--trn2-runner") and session.testscollected == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

    if _PREFETCHER is not None:  # before the sweep: its run in flight is this session's
        _PREFETCHER.stop(at_once=exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED))
    warm.stop_all()  # the zygotes are this session's to end; anything else left is a defect
    leftovers = _kill_leftover_ranks(session)
    if leftovers:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print("\nharness: processes launched by this session were still running (now killed):\n  "
              + "\n  ".join(leftovers))
    if not hasattr(session.config, "workerinput"):  # once per session: xdist's controller, or -n 0
        unread = unread_prefetches(session_root(session.config._tmp_path_factory))
        if unread and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            print("\nharness: runs launched ahead of need that no test read (the prefetcher's spec "
                  "of a test differs from the test's own, harness/launch/prefetch.py NEEDS):\n  "
                  + "\n  ".join(unread))
        repeated = repeated_launches(session_root(session.config._tmp_path_factory))
        if repeated:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            print("\nharness: runs launched more than once in this session (each distinct RunSpec "
                  "must launch once, harness/launch/run_cache.py):\n  "
                  + "\n  ".join(f"{run}: {n} launches" for run, n in sorted(repeated.items())))


def _kill_leftover_ranks(session: pytest.Session) -> list[str]:
    """Nothing this session launched may outlive it; nothing else is touched."""
    found = []
    for proc in leftover_processes():
        try:
            found.append(f"{proc.pid}: {' '.join(proc.cmdline())[:150]}")
            proc.kill()
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="session")
def device_profile(pytestconfig: pytest.Config):
    return detect(pytestconfig.getoption("--device"))


@pytest.fixture(scope="session")
def backend_runs(device_profile, device_runs) -> RunCache:
    """The run cache of the detected (or ``--device``) device, for the self-tests."""
    return device_runs(device_profile.kind)


@pytest.fixture(scope="session")
def device_runs(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config):
    """``device_runs(kind).get(RunSpec(...))``: one run cache per device kind, shared by every
    test and every pytest-xdist worker of the session (each distinct RunSpec launches once)."""
    caches: dict[str, RunCache] = {}
    rendezvous = tuple(pytestconfig.getoption("--torchrun-arg"))
    root = session_root(tmp_path_factory)

    def get(kind: str) -> RunCache:
        if kind not in caches:
            caches[kind] = RunCache(profile_for(kind), dump_layout.runs_folder(root, kind),
                                    rendezvous=rendezvous)
        return caches[kind]

    return get


@pytest.fixture(scope="session")
def steps(pytestconfig: pytest.Config) -> int:
    return pytestconfig.getoption("--steps")


@pytest.fixture(scope="session")
def workarounds(pytestconfig: pytest.Config) -> tuple[str, ...]:
    return tuple(pytestconfig.getoption("--workaround"))

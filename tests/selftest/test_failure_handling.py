"""Faults injected for real into torchtitan's trainer (plants, harness/plants) fail clearly.

Specification:
- a hung rank is killed, with its whole process tree, at the timeout, and the failure shows
  the last log lines of every rank;
- a crashed rank's traceback is shown;
- a NaN loss stops the run at the first bad step, which the checks name;
- nothing launched is left running.

Each fault is a real launch (about half a minute each on 2 cores): marked slow, run by CI with
``pytest -m slow tests/selftest``.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.checks import run_checks as checks
from harness.launch import warm
from harness.launch.children import leftover_processes
from harness.launch.run import RunSpec, launch
from harness.plants import PLANT_STEP
from harness.results.run_result import RunFailed

pytestmark = pytest.mark.slow


def _leftovers(run_dir) -> list[str]:
    """What this session launched that is still running (run_dir names the launch checked), but
    the zygotes it keeps for its next launches (harness/launch/warm.py; their ranks count)."""
    return [f"{p.pid}: {' '.join(p.cmdline())[:120]}" for p in leftover_processes()
            if p.pid not in warm.zygote_pids()]


@pytest.fixture(scope="module")
def hung_run(device_profile, tmp_path_factory):
    spec = RunSpec("titan_native", steps=4, plants=("hang_rank1",), timeout_s=75)
    return launch(spec, device_profile, tmp_path_factory.mktemp("faults") / "hung")


def test_hung_rank_is_killed_at_the_timeout(hung_run):
    assert hung_run.timed_out and hung_run.returncode is None, hung_run.describe()
    assert hung_run.duration_s < 75 + 30, "the kill took longer than the grace period"


def test_hung_rank_leaves_no_process_behind(hung_run):
    assert _leftovers(hung_run.run_dir) == []


def test_hung_rank_failure_shows_every_rank_log(hung_run):
    message = str(RunFailed(hung_run, "hung"))
    assert "--- rank 0:" in message and "--- rank 1:" in message
    assert f"rank 1 hangs at step {PLANT_STEP}" in message


def test_crashed_rank_traceback_is_shown(device_profile, tmp_path):
    run = launch(RunSpec("titan_native", steps=4, plants=("crash_rank1",)),
                 device_profile, tmp_path / "crash")
    problem = checks.completed(run, 4).problem
    assert problem and "exited with code" in problem
    message = str(RunFailed(run, problem))
    assert "Traceback" in message and f"plant crash_rank1: rank 1 crashed at step {PLANT_STEP}" in message
    assert _leftovers(run.run_dir) == []


def test_nan_loss_stops_the_run_at_the_first_bad_step(device_profile, tmp_path):
    run = launch(RunSpec("titan_native", steps=6, plants=("nan_loss",)),
                 device_profile, tmp_path / "nan")
    # torchtitan 0.3.0 raises itself before logging a non-finite step ("Loss is not finite
    # ... at step N"); the harness's sink raises too when upstream does not (metrics_sink.py).
    assert not run.ok
    assert [s.step for s in run.steps] == list(range(1, PLANT_STEP)), "kept training on NaN"
    assert checks.completed(run, 6).problem, "a NaN run must not count as completed"
    tails = run.log_tails()
    assert (f"Loss is not finite (global_avg_loss=nan) at step {PLANT_STEP}" in tails
            or f"non-finite loss nan at step {PLANT_STEP}" in tails), tails


def test_two_runs_in_parallel_do_not_collide(device_profile, tmp_path):
    """As under pytest-xdist: each torchrun --standalone picks its own free rendezvous port."""
    specs = [RunSpec("titan_native", steps=1, extra_env=(("HARNESS_PARALLEL", str(i)),))
             for i in range(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda ix: launch(ix[1], device_profile, tmp_path / f"p{ix[0]}"),
                             enumerate(specs)))
    for run in runs:
        assert checks.completed(run, 1).problem is None, run.log_tails()


"""The warm start for CPU ranks (harness/rank/warm_start.py, harness/launch/warm.py).

A torchrun worker whose launch has a zygote hands itself over: the zygote forks the rank, which
takes over the worker's environment, command, folder and standard streams; the worker passes on
torchrun's signals and exits as the rank exits; a worker killed outright takes its rank with it.
A rank whose environment differs from the zygote's in anything its imports could read starts
cold. That a warm run computes bit for bit what a cold one computes is checked on the template's
own runs (tests/e2e/test_training_state.py ``test_seeded_rerun_is_bitwise_identical``, and every
backend in the slow tests/selftest/test_determinism.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import plants
from harness.device.devices import ARROW_ENV, HF_ENV, detect
from harness.launch import warm
from harness.launch.run import RunSpec, rank_environment, run_patches
from harness.parity.env import prepare_in_process
from harness.rank.warm_start import STARTED_COLD, STARTED_WARM, TORCHRUN_SET, USED_CPU, refusal
from harness.registry import environment

ZYGOTE = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", environment.SHIMS: "cpu_device,gloo_reduce_op",
          environment.ZYGOTE: "1"}
TORCHRUN = {name: "0" for name in TORCHRUN_SET} | {"TORCHELASTIC_RUN_ID": "x"}


def rank(**changes) -> dict[str, str]:
    env = {k: v for k, v in ZYGOTE.items() if k != environment.ZYGOTE} | TORCHRUN
    env |= {environment.SHIMS: "cpu_device,gloo_reduce_op,jsonl_metrics_sink", environment.PLANTS: "p"}
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def test_a_rank_with_the_zygotes_environment_plus_torchruns_and_the_runs_own_is_forked():
    assert refusal(ZYGOTE, rank()) is None
    # pytest names the current test in the launcher's environment, which every rank inherits
    assert refusal(ZYGOTE | {"PYTEST_CURRENT_TEST": "a (call)"},
                   rank(PYTEST_CURRENT_TEST="b (call)")) is None


@pytest.mark.parametrize("changes, named", [
    ({"OMP_NUM_THREADS": "2"}, "OMP_NUM_THREADS"),  # read by the OpenMP runtime as torch loads
    ({"PATH": None}, "PATH"),
    ({"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}, "TORCHINDUCTOR_FX_GRAPH_CACHE"),  # read as inductor imports
    ({environment.SHIMS: "gloo_reduce_op"}, "shims"),  # the zygote installed cpu_device before importing
])
def test_a_rank_whose_imports_could_differ_starts_cold_and_says_why(changes, named):
    reason = refusal(ZYGOTE, rank(**changes))
    assert reason is not None and named in reason


def test_what_the_zygotes_own_imports_set_is_not_a_difference():
    env = rank(TORCHINDUCTOR_CACHE_DIR="/tmp/torchinductor_x")
    assert refusal(ZYGOTE, env, {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_x"}) is None
    assert "TORCHINDUCTOR_CACHE_DIR" in refusal(ZYGOTE, env, {"TORCHINDUCTOR_CACHE_DIR": "/elsewhere"})


def test_a_ranks_environment_is_the_same_before_and_after_the_in_process_checks_set_theirs(monkeypatch):
    """The in-process checks set the Hugging Face libraries' variables in the pytest process
    (harness/parity/env.py), whose environment every later launch inherits: a run launched
    after them must get the environment it gets before them, or a worker's zygote, started
    before them, refuses its ranks and a second zygote imports everything again."""
    profile = detect("cpu")
    for name in HF_ENV:
        monkeypatch.delenv(name, raising=False)
    before = rank_environment(RunSpec("titan_native"), profile)
    prepare_in_process()  # idempotent: it may have run in this process already
    for name, value in HF_ENV.items():
        monkeypatch.setenv(name, os.environ.get(name, value))  # as the set-up leaves them
    assert rank_environment(RunSpec("titan_native"), profile) == before


# ---------------------------------------------------------------- a real zygote, with stand-in workers
# The workers run standard-library modules (``python -u -m <module>``), as torchrun runs
# ``-m torchtitan.train``: what is checked here is the hand-over, not training.


@pytest.fixture(scope="module")
def worker_env():
    """A CPU rank's environment for this process's zygote (the one its launches use), as
    torchrun's worker has it."""
    profile = detect("cpu")
    env = rank_environment(RunSpec("titan_native"), profile)
    socket, why = warm.socket_for(env, profile.shims)
    if socket is None:
        pytest.fail(f"no zygote here ({why}): every CPU launch would start its ranks cold")
    return env | TORCHRUN | {"LOCAL_RANK": "0", environment.WARM_SOCKET: socket}


def worker(env, *module_args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-u", "-m", *module_args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def forked_rank(zygote_pid: int, timeout_s: float = 60.0, before=frozenset()) -> psutil.Process:
    """The rank the zygote forks next: a child not among ``before`` (its children's pids when
    the worker started)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = [c for c in psutil.Process(zygote_pid).children() if c.pid not in before]
        if children:
            return children[-1]
        time.sleep(0.05)
    raise AssertionError("the zygote forked no rank")


def forwarding(worker: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Wait until ``worker`` catches SIGTERM (``SigCgt`` in /proc/PID/status): it has the rank's
    pid and forwards the signal. Before that, SIGTERM ends the worker by default and the zygote
    ends the rank when it sees the worker's connection close (the next test's case)."""
    bit = 1 << (signal.SIGTERM - 1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = Path(f"/proc/{worker.pid}/status").read_text()
        caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
        if caught & bit:
            return
        time.sleep(0.01)
    raise AssertionError(f"worker {worker.pid} never took its rank's pid")


def ranks_of(zygote_pid: int) -> frozenset:
    return frozenset(c.pid for c in psutil.Process(zygote_pid).children())


def zygote_pid(env) -> int:
    return next(z.process.pid for z in warm._ZYGOTES if z.socket == env[environment.WARM_SOCKET])


def test_the_forked_rank_runs_the_workers_command_on_its_streams_and_exits_as_it_does(worker_env, tmp_path):
    done = subprocess.run([sys.executable, "-u", "-m", "calendar", "2026", "12"], env=worker_env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "December 2026" in done.stdout, done.stderr
    assert STARTED_WARM in done.stderr and USED_CPU in done.stderr, done.stderr
    failed = subprocess.run([sys.executable, "-u", "-m", "json.tool", str(tmp_path / "absent")],
                            env=worker_env, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2 and "No such file" in failed.stderr, failed.stderr  # argparse's exit
    crashed = subprocess.run([sys.executable, "-u", "-m", "calendar", "2026", "13"], env=worker_env,
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 1 and "IndexError" in crashed.stderr, crashed.stderr  # a traceback


def test_torchruns_sigterm_reaches_the_rank_and_the_worker_dies_of_it(worker_env):
    before = ranks_of(zygote_pid(worker_env))
    sleeper = worker(worker_env, "timeit", "-n1", "-r1", "__import__('time').sleep(120)")
    child = forked_rank(zygote_pid(worker_env), before=before)
    forwarding(sleeper)  # as torchrun's SIGTERM finds it mid-run, not before it took the rank's pid
    sleeper.send_signal(signal.SIGTERM)
    assert sleeper.wait(timeout=30) == -signal.SIGTERM
    # the worker ends when the zygote reports the rank reaped: nothing of it is left
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE


def test_a_worker_killed_outright_takes_its_rank_with_it(worker_env):
    before = ranks_of(zygote_pid(worker_env))
    sleeper = worker(worker_env, "timeit", "-n1", "-r1", "__import__('time').sleep(120)")
    child = forked_rank(zygote_pid(worker_env), before=before)
    sleeper.kill()
    sleeper.wait(timeout=30)
    gone, _ = psutil.wait_procs([child], timeout=30)
    assert gone, f"rank {child.pid} outlived its SIGKILLed worker"


def test_a_rank_the_zygote_refuses_starts_cold_in_the_worker(worker_env):
    env = worker_env | {"OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-u", "-m", "calendar", "2026", "12"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "December 2026" in done.stdout
    assert f"{STARTED_COLD} OMP_NUM_THREADS" in done.stderr and STARTED_WARM not in done.stderr


def test_the_hand_over_imports_nothing_heavy():
    """Every CPU worker imports the hand-over before anything else: the standard library only."""
    done = subprocess.run([sys.executable, "-c", "import sys, harness.rank.warm_start as w; "
                           "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                           "('torch', 'numpy', 'torchtitan', 'transformers')))"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_run_that_patches_what_the_zygote_imported_starts_cold_and_says_which(worker_env):
    """The zygote imported transformers (the device's shims acting first); a run's own patch of
    a module it imported would act after that import, not as a cold rank's does."""
    profile = detect("cpu")
    zygote = next(z for z in warm._ZYGOTES if z.socket == worker_env[environment.WARM_SOCKET])
    assert "transformers.models.qwen3.modeling_qwen3" in zygote.modules
    assert not any(m.split(".")[0] == "torchtitan" for m in zygote.modules)
    in_transformers = next(p.name for p in plants.of("patch") if p.patch[0].startswith("transformers."))
    planted = rank_environment(RunSpec("hf_v5", plants=(in_transformers,)), profile)
    assert run_patches(planted, profile) >= {"transformers.models.qwen3.modeling_qwen3"}
    socket, why = warm.socket_for(planted, profile.shims, run_patches(planted, profile))
    assert socket is None and "transformers.models.qwen3.modeling_qwen3" in why, why
    # a plant that replaces a class's method acts alike after the import (the TP plant's
    # catching test, tests/parity/test_layouts.py, runs it warm)
    on_a_class = rank_environment(RunSpec("titan_native", plants=("tp_partial_sums_unreduced",)), profile)
    assert run_patches(on_a_class, profile) == frozenset()
    # the device's own shims are not the run's: the backend's run itself starts warm
    plain = rank_environment(RunSpec("hf_v5"), profile)
    assert not any(m.startswith("transformers") for m in run_patches(plain, profile))
    assert warm.socket_for(plain, profile.shims, run_patches(plain, profile))[0] == zygote.socket


def test_pyarrow_starts_its_allocator_thread_unless_a_cpu_rank_turns_it_off():
    """Still needed (harness/device/devices.py ARROW_ENV): without it, a process that imported
    datasets has a second thread and cannot be a zygote."""
    count = ("import os, pyarrow; print(len(os.listdir('/proc/self/task')))")
    env = {k: v for k, v in os.environ.items() if k not in ARROW_ENV} | {"OMP_NUM_THREADS": "1"}
    threads = [int(subprocess.run([sys.executable, "-c", count], env=e, capture_output=True,
                                  text=True, timeout=120, check=True).stdout)
               for e in (env, env | ARROW_ENV)]
    assert threads == [2, 1], threads


def test_a_sigterm_as_soon_as_the_rank_exists_still_ends_it(worker_env):
    """torchrun may stop a worker the moment its rank exists: the rank, forked from a zygote
    whose own SIGTERM handler it inherits until it resets it, must die of the signal all the
    same (the zygote blocks the forwarded signals across the fork, the rank unblocks them once
    its handlers are reset). Repeated: the window is a fork's length (without the block, 3
    tries failed in 2 sessions of 3, 8 tries in the one session run)."""
    zygote = psutil.Process(zygote_pid(worker_env))
    for _ in range(6):
        before = ranks_of(zygote.pid)
        sleeper = worker(worker_env, "timeit", "-n1", "-r1", "__import__('time').sleep(120)")
        deadline = time.monotonic() + 60
        while ranks_of(zygote.pid) <= before and time.monotonic() < deadline:
            time.sleep(0.001)
        sleeper.send_signal(signal.SIGTERM)
        assert sleeper.wait(timeout=30) == -signal.SIGTERM
        # its rank ends too, whichever way the worker went (a worker that died before it took
        # the rank's pid leaves the zygote to end the rank)
        _, alive = psutil.wait_procs(zygote.children(), timeout=30)
        assert not alive, f"ranks {[p.pid for p in alive]} outlived their SIGTERMed workers"

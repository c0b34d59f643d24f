"""How the suite spreads over pytest-xdist workers (``-n auto``, conftest.py).

Specification:
- a CPU-only selection gets two workers; an accelerator tier (``-m neuron``/``-m cuda``, or
  ``--device neuron|cuda``) and a single core get none (one process);
- each worker's torch, and every process its tests start, gets the worker's share of the
  cores as intra-op threads (one each on two cores), so the workers and the launched ranks do
  not oversubscribe the machine; a single process keeps torch's default;
- each distinct RunSpec launches once per session, however many tests on however many
  workers read it: a real ``-n 2`` session of four tests needing one run, spread over both
  workers, launches it once (run folders counted on disk, not from the cache's own ledger);
- the session fails, naming the run, when a run was launched twice (the ledger), also as two
  specs that differ only in a worker's own temporary folder (an input each worker built for
  itself); inputs that go into a spec are built once per session, where every worker finds them.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from harness.device.devices import THREADS_ENV, worker_threads, xdist_workers
from harness.launch.run import RunSpec
from harness.launch.run_cache import repeated_launches, shared_folder, spec_key
from harness.registry import dump_layout, paths


@pytest.mark.parametrize(("device", "markexpr", "cpus", "workers"), [
    (None, "not slow", 2, 2),
    ("cpu", "slow", 16, 2),
    (None, "neuron", 128, 0),
    (None, "cuda and not slow", 16, 0),
    ("neuron", "not slow", 128, 0),
    ("cuda", None, 16, 0),
    (None, "not slow", 1, 0),
    (None, None, None, 0),
])
def test_workers_for_a_selection(device, markexpr, cpus, workers):
    assert xdist_workers(device, markexpr, cpus) == workers


@pytest.mark.parametrize(("workers", "cpus", "threads"), [
    (2, 2, 1), (2, 16, 8), (2, 3, 1), (2, None, 1), (0, 2, None), (0, 128, None),
])
def test_threads_of_a_worker(workers, cpus, threads):
    assert worker_threads(workers, cpus) == threads


def test_this_process_has_its_share_of_the_cores():
    """This very session, under xdist: torch and the environment children inherit hold the
    worker's share of the cores."""
    share = worker_threads(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")), os.cpu_count())
    if share is None:
        pytest.skip("one process (-n 0): torch keeps its default threads")
    assert torch.get_num_threads() == share
    assert os.environ.get(THREADS_ENV) == str(share)


# Slow tier: a pytest session of its own with two workers and one launch (~1 min on 2 cores).
@pytest.mark.slow
def test_a_run_read_on_two_workers_launches_once(tmp_path):
    basetemp = tmp_path / "session"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2", "--dist",
         "load", "-m", "", f"--basetemp={basetemp}", "tests/selftest/launch_once_cases.py"],
        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    workers = set(re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED", done.stdout, re.MULTILINE))
    assert workers == {"gw0", "gw1"}, "the four readers did not spread over both workers:\n" + done.stdout[-2000:]
    launched = sorted(p.parent.relative_to(basetemp) for p in basetemp.rglob(dump_layout.COMMAND))
    assert len(launched) == 1, f"one run, launched {len(launched)} times: {launched}"


def test_a_run_launched_twice_is_found(tmp_path):
    """Once by the shared cache and once by a worker's own, or twice by one cache."""
    for folder, runs in ((".", ["a-1", "b-2", "c-3", "c-3"]), ("popen-gw1", ["a-1"]),
                         ("popen-gw1/test_x0", ["b-2"])):  # a test's own session: not this one
        cache = dump_layout.runs_folder(tmp_path / folder, "cpu")
        cache.mkdir(parents=True)
        dump_layout.ledger(cache).write_text("".join(json.dumps({"run": r}) + "\n" for r in runs))
    assert repeated_launches(tmp_path) == {"a-1": 2, "c-3": 2}


def _twin_spec(root: str) -> RunSpec:
    return RunSpec("titan_native", size="full", init="pretrained", hf_assets_path=f"{root}/Qwen3-4B")


def test_specs_that_differ_only_in_a_workers_folder_are_one_run(tmp_path):
    gw0, gw1 = _twin_spec("/tmp/s/popen-gw0/assets_twin0"), _twin_spec("/tmp/s/popen-gw1/assets_twin0")
    assert gw0 != gw1 and spec_key(gw0) == spec_key(gw1)
    assert spec_key(gw0) != spec_key(_twin_spec("/tmp/s/assets_twin"))
    cache = dump_layout.runs_folder(tmp_path, "cpu")
    cache.mkdir()
    dump_layout.ledger(cache).write_text("".join(
        json.dumps({"run": run, "key": spec_key(spec)}) + "\n"
        for run, spec in (("twin-0a", gw0), ("twin-1b", gw1), ("other-2c", _twin_spec("/x")))))
    assert repeated_launches(tmp_path) == {"twin-0a = twin-1b": 2}


class _Factory:  # what shared_folder reads of pytest's TempPathFactory
    def __init__(self, base):
        self.base = base

    def getbasetemp(self):
        return self.base


def test_an_input_built_for_the_session_is_one_folder_for_every_worker(tmp_path, monkeypatch):
    built = []

    def build(path):
        built.append(path)
        path.mkdir()

    folders = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        folders.append(shared_folder(_Factory(tmp_path / f"popen-{worker}"), "assets_twin", build))
    assert folders == [tmp_path / "assets_twin"] * 2 and built == [tmp_path / "assets_twin"]

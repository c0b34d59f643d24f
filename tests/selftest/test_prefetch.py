"""Runs launched ahead of need (harness/launch/prefetch.py).

Specification:
- the runs a session prefetches are the ones its collected tests read, by the fixtures' own
  spec of each run parameter (``NEEDS``), in the tests' order, each once; runs of another
  device, full-size runs, a user's ``--subject`` config and tests marked to skip are left to
  their tests;
- ``RunCache.prefetch`` launches a run that is neither stored nor being launched, and only
  then; the test that reads it later gets the stored result without a launch of its own;
- a stored result is read back with the spec it ran, and only as the result of that spec: one
  stored in an older form (a result without its ``RunSpec``) is launched again, never read,
  and the session's report refuses it, named;
- a run launched ahead and read by no test fails the session, named
  (``run_cache.unread_prefetches``): the prefetcher's spec of a test differs from the test's;
- the prefetcher stops between launches when told, and one process of a session starts it;
- the device decides: CPU prefetches, an accelerator (whose launches would share its
  devices) does not;
- the prefetcher only launches: what it imports to launch a run and record its versions
  (torch, torchtitan, transformers, datasets: about 3 CPU s, once per session) it does not
  import.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest
from filelock import FileLock

from harness.backends import BACKENDS
from harness.device.devices import DeviceProfile, profile_for
from harness.launch import prefetch, run_cache
from harness.launch.run import RunSpec
from harness.launch.run_cache import RunCache, unread_prefetches
from harness.launch.run_matrix import LayoutCase, RunCase, SubjectCase
from harness.launch.subjects import Subject
from harness.registry import dump_layout
from harness.results.run_result import RunResult

STEPS, WORKAROUNDS = 10, ("hf_block_causal",)


class _Item:
    """What ``needed_specs`` reads of a collected pytest item."""

    def __init__(self, marks=(), **params):
        self.callspec = SimpleNamespace(params=params)
        self._marks = marks

    def iter_markers(self, name):
        return [m for m in self._marks if m == name]


def test_the_runs_prefetched_are_the_ones_the_collected_tests_read_in_their_order():
    hf = RunCase("cpu", "hf_v5", "tiny", "pretrained", "causal")
    moe = RunCase("cpu", "nki_moe", "tiny", "random", BACKENDS["nki_moe"].default_attention)  # the training-state run
    ep = LayoutCase("cpu", "nki_moe", "ep")
    items = [
        _Item(run_case=hf, check="finite"),
        _Item(run_case=hf, check="completed"),  # the same run: once
        _Item(layout_case=ep),
        _Item(moe_fsdp_layout_case=ep),
        _Item(published_case=moe),
        _Item(run_case=RunCase("cuda", "hf_v5", "tiny", "pretrained", "causal")),  # another device
        _Item(run_case=RunCase("cpu", "titan_native", "full", "pretrained", "sdpa")),  # full size
        _Item(marks=("skip",), run_case=RunCase("cpu", "titan_native", "tiny", "random", "sdpa")),
        _Item(reader=3),  # no run parameter
        _Item(run_case=SubjectCase("cpu", Subject.parse("user_configs:native_tiny"))),  # --subject
    ]
    specs = prefetch.needed_specs(items, "cpu", STEPS, WORKAROUNDS)
    # tests/e2e/conftest.py launched_run and tests/parity/test_layouts.py layout_run
    assert specs == [hf.suite_spec(STEPS, workarounds=WORKAROUNDS), ep.run_spec(STEPS, WORKAROUNDS),
                     moe.suite_spec(STEPS, workarounds=WORKAROUNDS)]
    assert specs[0].workarounds == ("hf_block_causal",) and specs[2].steps == 3  # the fixtures' own


def _fake_cache(tmp_path, monkeypatch):
    launched = []

    def fake_launch(spec, profile, run_dir):
        launched.append(spec)
        return RunResult(spec=spec, device=profile.kind, nproc=2, layout=spec.layout,
                         degrees=spec.parallel_degrees(2), command=[], returncode=0,
                         timed_out=False, duration_s=0.0, run_dir=run_dir)

    monkeypatch.setattr(run_cache, "launch", fake_launch)
    return RunCache(profile_for("cpu"), dump_layout.runs_folder(tmp_path, "cpu")), launched


def test_a_prefetched_run_is_launched_once_and_read_by_its_test(tmp_path, monkeypatch):
    cache, launched = _fake_cache(tmp_path, monkeypatch)
    spec = RunSpec("titan_native", init="pretrained")
    assert cache.prefetch(spec) is True and launched == [spec]
    assert cache.prefetch(spec) is False, "a stored run was prefetched again"
    assert unread_prefetches(tmp_path) != []
    other = RunCache(cache.profile, cache.root)  # the test's worker
    assert other.get(spec).returncode == 0 and launched == [spec], "the test launched it again"
    assert unread_prefetches(tmp_path) == []
    entry = json.loads(dump_layout.ledger(cache.root).read_text().splitlines()[0])
    assert entry["prefetched"] is True


def test_a_stored_result_is_its_specs_and_one_of_an_older_form_is_launched_again(tmp_path, monkeypatch):
    cache, launched = _fake_cache(tmp_path, monkeypatch)
    spec = RunSpec("titan_native", init="pretrained")
    assert cache.get(spec).spec == spec and launched == [spec]
    stored = dump_layout.stored_result(cache.run_dir(spec))
    assert RunCache(cache.profile, cache.root).get(spec).spec == spec and launched == [spec]
    # a result stored before results carried their spec: its fields as strings, no spec
    old = object.__new__(RunResult)
    old.__dict__.update(name=spec.name, backend="titan_native", size="tiny", init="pretrained",
                        device="cpu", nproc=2, command=[], returncode=0, timed_out=False,
                        duration_s=0.0, run_dir=stored.parent / "old", layout="fsdp")
    stored.write_bytes(pickle.dumps(old))
    assert run_cache.read_stored(stored) is None
    with pytest.raises(ValueError, match="without the RunSpec it ran"):
        run_cache.stored_results(tmp_path)
    again = RunCache(cache.profile, cache.root).get(spec)
    assert again.spec == spec and launched == [spec, spec], "the older result was read as this run's"
    assert run_cache.stored_results(tmp_path)[-1].spec == spec


def test_a_run_another_process_is_launching_is_not_prefetched(tmp_path, monkeypatch):
    cache, launched = _fake_cache(tmp_path, monkeypatch)
    spec = RunSpec("titan_native", init="pretrained")
    lock = dump_layout.lock_file(cache.run_dir(spec))
    with FileLock(str(lock)):  # held as a worker launching it holds it
        assert cache.prefetch(spec) is False
    assert launched == []


def test_a_run_launched_ahead_that_no_test_reads_is_named(tmp_path, monkeypatch):
    """What the session's end reports when a fixture's spec and the prefetcher's differ."""
    cache, _ = _fake_cache(tmp_path, monkeypatch)
    asked = RunSpec("titan_native", init="pretrained")
    cache.prefetch(asked)
    cache.get(RunSpec("titan_native", init="pretrained", steps=9))  # the test's own spec differs
    unread = unread_prefetches(tmp_path)
    assert len(unread) == 1 and unread[0].startswith("titan_native-tiny-pretrained")


def test_the_prefetcher_stops_between_launches_when_told():
    class Cache:
        def __init__(self):
            self.launched = []

        def prefetch(self, spec):
            self.launched.append(spec)
            stop.append("told")  # SIGUSR1 arrives during this launch
            return True

    stop, cache = [], Cache()
    specs = [RunSpec("titan_native"), RunSpec("nki_moe")]
    assert prefetch.prefetch_all(cache, specs, stop) == specs[:1] == cache.launched


def test_one_process_of_a_session_starts_the_prefetcher(tmp_path, monkeypatch):
    started = []

    class Popen:
        def __init__(self, command, **kwargs):
            started.append(command)

    monkeypatch.setattr(prefetch.subprocess, "Popen", Popen)
    specs = [RunSpec("titan_native")]
    first = prefetch.start(tmp_path, "cpu", specs)
    second = prefetch.start(tmp_path, "cpu", specs)  # the other worker
    assert first is not None and second is None
    assert started == [[sys.executable, "-m", "harness.launch.prefetch", str(tmp_path)]]
    assert pickle.loads(dump_layout.prefetch_specs(tmp_path).read_bytes()) == ("cpu", specs)
    assert prefetch.start(tmp_path / "none", "cpu", []) is None  # nothing to launch


def test_only_a_device_whose_launches_overlap_prefetches():
    assert profile_for("cpu").prefetch is True
    assert DeviceProfile(kind="neuron", process_group_backend="xla", ranks_per_node=64,
                         device_count=16).prefetch is False


def test_launching_a_run_and_recording_its_versions_imports_no_training_library(tmp_path):
    """The prefetcher's process launches runs and reads their results; the ranks train."""
    launching = ("import sys; import harness.launch.prefetch, harness.launch.run_matrix; "
                 "from harness.launch.run_cache import RunCache; "
                 "from harness.device.devices import profile_for; "
                 "from harness.launch.run import RunSpec, node_commands; "
                 "from pathlib import Path; "
                 f"node_commands(RunSpec('nki_moe', layout='ep'), profile_for('cpu'), Path({str(tmp_path)!r})); "
                 "from harness.upstream.versions import package_versions; package_versions(); "
                 "print(sorted({m.split('.')[0] for m in sys.modules} "
                 "& {'torch', 'torchtitan', 'transformers', 'datasets'}))")
    done = subprocess.run([sys.executable, "-c", launching], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr

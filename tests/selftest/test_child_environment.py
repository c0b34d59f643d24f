"""Every process the harness starts gets its environment from one builder
(harness/registry/environment.py ``child_environment``) and carries the session's marker, so the
end-of-session sweep (harness/launch/children.py) finds whatever outlives its test.

Specification:
- each way the harness starts a child (a run's ranks, a probe child, a random-init forward, a
  diagnosis walk, the launch prefetcher) is started with ``subprocess`` stood in for, and the
  environment it was given is read: it carries ``SESSION=SESSION_ID`` and this tree on its path;
  a child that starts as a rank starts has the boot folder first on its path and exactly the
  shims and plants it names, whatever its parent's environment holds;
- the builder: a plain child carries none of a rank's own variables (``RANK_ONLY``) and names
  none; a rank child's ``extra`` comes after what it names; the marker comes last.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from harness.checks import random_init_forward
from harness.device.devices import CPU_SHIMS, detect
from harness.diagnosis import diagnose
from harness.launch import prefetch
from harness.launch.run import RunSpec, rank_environment
from harness.registry import environment, paths
from harness.upstream import probes


class Started(Exception):
    """What the stand-in for ``subprocess`` raises, with the environment it was given."""

    def __init__(self, env):
        super().__init__("started")
        self.env = env


@pytest.fixture
def started(monkeypatch):
    """The environment of the child a call starts (the child itself is not started); the
    parent's environment names a shim, a plant and the observers a child must not inherit."""
    def stand_in(*args, env=None, **kwargs):
        raise Started(env)

    monkeypatch.setattr(subprocess, "run", stand_in)
    monkeypatch.setattr(subprocess, "Popen", stand_in)
    for variable in (environment.SHIMS, environment.PLANTS, environment.OBSERVERS):
        monkeypatch.setenv(variable, "inherited")

    def env_of(start) -> dict[str, str]:
        with pytest.raises(Started) as raised:
            start()
        return raised.value.env
    return env_of


def _path(env) -> list[str]:
    return env["PYTHONPATH"].split(os.pathsep)


def _ranks(tmp_path):
    raise Started(rank_environment(RunSpec("titan_native"), detect("cpu")))  # launch's torchrun's


def _probe(tmp_path):
    probes.observe({"p": "print(1)"}, ("gloo_reduce_op",))


def _random_init_forward(tmp_path):
    random_init_forward.run_child(["case"], tmp_path / "log")


def _diagnosis(tmp_path):
    diagnose.localize_in_child({}, tmp_path / "log")


def _prefetcher(tmp_path):
    prefetch.start(tmp_path, "cpu", [RunSpec("titan_native")])


# child: (how the harness starts it, whether it starts as a rank starts)
CHILDREN = {"ranks": (_ranks, True), "probe": (_probe, True),
            "random-init forward": (_random_init_forward, True), "diagnosis": (_diagnosis, False),
            "prefetcher": (_prefetcher, False)}


@pytest.mark.parametrize("child", list(CHILDREN))
def test_every_child_carries_the_session_marker_and_this_tree(child, started, tmp_path):
    start, as_rank = CHILDREN[child]
    env = started(lambda: start(tmp_path))
    assert env[environment.SESSION] == environment.SESSION_ID
    assert str(paths.REPO_ROOT) in _path(env)
    if as_rank:
        assert _path(env)[0] == str(paths.BOOT_DIR)
        assert env.get(environment.PLANTS) is None, "a plant inherited from the parent"
    else:
        assert not set(environment.RANK_ONLY) & set(env), "a plain child carries a rank's variables"


def test_a_child_started_as_a_rank_gets_exactly_the_shims_it_names(started, tmp_path):
    probe = started(lambda: _probe(tmp_path))
    assert probe[environment.SHIMS] == "gloo_reduce_op"
    forward = started(lambda: _random_init_forward(tmp_path))
    assert forward[environment.SHIMS] == ",".join(CPU_SHIMS)
    assert environment.OBSERVERS not in probe and environment.OBSERVERS not in forward


def test_the_builder_puts_what_a_child_names_before_its_extra_and_the_marker_last():
    base = {"PYTHONPATH": "/elsewhere", environment.SHIMS: "inherited", environment.SESSION: "other"}
    plain = environment.child_environment(base=base)
    assert plain == {"PYTHONPATH": os.pathsep.join((str(paths.REPO_ROOT), "/elsewhere")),
                     environment.SESSION: environment.SESSION_ID}
    rank = environment.child_environment(base=base, rank=True, shims=("a", "b"), plants=("p",),
                                         observers=("batches",), python_path=("/user",),
                                         **{environment.OBSERVERS: "", environment.SESSION: "x"})
    assert _path(rank) == [str(paths.BOOT_DIR), "/user", str(paths.REPO_ROOT), "/elsewhere"]
    assert (rank[environment.SHIMS], rank[environment.PLANTS], rank[environment.OBSERVERS]) == ("a,b", "p", "")
    assert rank[environment.SESSION] == environment.SESSION_ID
    with pytest.raises(ValueError, match="rank child"):
        environment.child_environment(shims=("a",))

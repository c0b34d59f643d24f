"""A launched rank imports with automatic garbage collection off, and torchtitan's trainer
finds it on, the imports' objects frozen; a pytest process collects the suite with it off and
runs its tests with it on, frozen likewise (harness/rank/startup_gc.py). Start-up is cheaper, and
what the trainer does with the collector is what it does without the harness."""

from __future__ import annotations

import gc
import subprocess
import sys
import types
from pathlib import Path

from torchtitan.tools.utils import GarbageCollection

from harness.rank.startup_gc import RANK_ENV, enable_as_trainer_builds
from harness.registry import environment

# What a rank's boot leaves (with a shim that imports nothing yet, so the child is cheap):
# collection at start-up, and whether torchtitan.trainer has the hook that turns it back on.
STARTUP = """
import gc, sys
from harness.rank.startup_gc import enable_as_trainer_builds
hooked = any(getattr(f, "module_name", None) == "torchtitan.trainer"
             and getattr(f, "patch", None) is enable_as_trainer_builds for f in sys.meta_path)
print(gc.isenabled(), hooked)
"""


def _child(extra_env: dict[str, str]) -> str:
    env = environment.child_environment(rank=True, shims=("gloo_reduce_op",))
    env.pop(RANK_ENV, None)
    done = subprocess.run([sys.executable, "-c", STARTUP], env={**env, **extra_env},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_launched_rank_imports_with_collection_off_until_its_trainer_is_built():
    assert _child({RANK_ENV: "0"}) == "False True"


def test_any_other_process_of_a_launch_keeps_python_s_collection():
    """torchrun's own process (no LOCAL_RANK) and the probe children are left alone."""
    assert _child({}) == "True False"


def test_the_trainer_finds_collection_on_and_manages_it_as_it_always_does():
    """On, with everything allocated before it frozen: torchtitan's first collection
    (``collect(1)``) then walks only what the trainer allocates, as after automatic collection
    (which would have aged the imports into the generation ``collect(1)`` skips)."""
    seen = {}

    class Trainer:  # stands in for torchtitan's: it takes over collection in __init__
        def __init__(self):
            seen["on"] = gc.isenabled()
            seen["froze what came before"] = gc.get_freeze_count() > frozen_before
            seen["young objects"] = len(gc.get_objects(0)) + len(gc.get_objects(1)) < 10_000
            self.gc_handler = GarbageCollection(gc_freq=5)

    enable_as_trainer_builds(types.SimpleNamespace(Trainer=Trainer))
    enable_as_trainer_builds(types.SimpleNamespace(Trainer=Trainer))  # idempotent
    was, frozen_before = gc.isenabled(), gc.get_freeze_count()
    gc.disable()
    allocated_before = [[] for _ in range(50_000)]  # stands in for the imports' objects
    try:
        Trainer()
        after = gc.isenabled()
    finally:
        gc.unfreeze()  # this process's frozen objects back to the oldest generation
        if frozen_before:
            gc.freeze()
        gc.enable() if was else gc.disable()
    del allocated_before
    assert seen == {"on": True, "froze what came before": True, "young objects": True}
    assert after is False  # torchtitan's GarbageCollection: off, collecting every gc_freq steps


def test_this_pytest_process_runs_its_tests_with_collection_on_and_the_suite_s_imports_frozen():
    """conftest.py pauses collection over the suite's collection (torch, torchtitan and
    transformers imported by the test modules) and resumes it frozen once collected."""
    assert gc.isenabled()
    assert gc.get_freeze_count() > 100_000  # torch alone is several hundred thousand objects


def test_xdist_s_controller_resumes_collection_as_its_session_starts(pytestconfig):
    """The controller collects no test, so it resumes as the session starts; a worker, or a
    run without xdist, waits for its collection."""
    root = Path(__file__).resolve().parents[2] / "conftest.py"
    conftest, = (p for p in pytestconfig.pluginmanager.get_plugins()
                 if getattr(p, "__file__", None) and Path(p.__file__).resolve() == root)

    def session(plugins):
        manager = types.SimpleNamespace(has_plugin=lambda name: name in plugins)
        return types.SimpleNamespace(config=types.SimpleNamespace(pluginmanager=manager))

    was = gc.isenabled()
    seen = []
    try:
        for plugins in ((), ("dsession",)):
            gc.disable()
            conftest.pytest_sessionstart(session(plugins))
            seen.append(gc.isenabled())
    finally:
        gc.enable() if was else gc.disable()
    assert seen == [False, True]

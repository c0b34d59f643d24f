"""A launched rank imports with automatic garbage collection off, and torchtitan's trainer
finds it on (harness/rank_gc.py): a rank's start-up is cheaper, and what the trainer does with
the collector is what it does without the harness."""

from __future__ import annotations

import gc
import subprocess
import sys
import types

from harness.rank_gc import RANK_ENV, enable_as_trainer_builds
from harness.upstream import probes

# What a rank's boot leaves (with a shim that imports nothing yet, so the child is cheap):
# collection at start-up, and whether torchtitan.trainer has the hook that turns it back on.
STARTUP = """
import gc, sys
from harness.rank_gc import enable_as_trainer_builds
hooked = any(getattr(f, "module_name", None) == "torchtitan.trainer"
             and getattr(f, "patch", None) is enable_as_trainer_builds for f in sys.meta_path)
print(gc.isenabled(), hooked)
"""


def _child(extra_env: dict[str, str]) -> str:
    env = probes.child_environment(("gloo_reduce_op",))
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
    from torchtitan.tools.utils import GarbageCollection

    seen = {}

    class Trainer:  # stands in for torchtitan's: it takes over collection in __init__
        def __init__(self):
            seen["as_init_begins"] = gc.isenabled()
            self.gc_handler = GarbageCollection(gc_freq=5)

    enable_as_trainer_builds(types.SimpleNamespace(Trainer=Trainer))
    enable_as_trainer_builds(types.SimpleNamespace(Trainer=Trainer))  # idempotent
    was = gc.isenabled()
    gc.disable()
    try:
        Trainer()
        after = gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()
    assert seen == {"as_init_begins": True}
    assert after is False  # torchtitan's GarbageCollection: off, collecting every gc_freq steps

"""The harness's environment variables, each named here once, and the one builder of the
environment of every process the harness starts (``child_environment``).

Every name starts with ``PREFIX``; every other module imports the name from here
(tests/selftest/test_environment.py finds a ``HARNESS_*`` string spelled anywhere else in
harness/, conftest.py or scripts/).

Every process the harness starts (torchrun and its ranks, a warm zygote, a probe or diagnosis
child, a random-init forward, a child pytest, the launch prefetcher) gets its environment from
``child_environment`` and so carries the session's marker ``SESSION=SESSION_ID``: at the end of
a pytest session anything still running with it, and nothing else, is killed and fails the
session (harness/launch/children.py ``leftover_processes``, conftest.py).

Standard library only: a launched rank's boot ``sitecustomize`` imports it before torch.
"""

from __future__ import annotations

import os

from harness.registry import paths

PREFIX = "HARNESS_"

# ---- every process the harness starts
# This session's marker (``SESSION_ID``), which the end-of-session sweep finds processes by.
SESSION = "HARNESS_LAUNCHER_SESSION"

# ---- a launched rank's, read by its boot sitecustomize (harness/rank/boot) and what it installs
# Comma-separated upstream shims to install (harness/upstream/install.py).
SHIMS = "HARNESS_SHIMS"
# Comma-separated planted defects to install (harness/plants; self-tests only).
PLANTS = "HARNESS_PLANTS"
# Comma-separated rank-side observers to install (harness/rank/observers.py).
OBSERVERS = "HARNESS_OBSERVERS"
# How many first steps' batches the ``batches`` observer dumps (default 1).
DUMP_STEPS = "HARNESS_DUMP_STEPS"
# The socket of the warm zygote a CPU rank hands itself over to (harness/rank/warm_start.py).
WARM_SOCKET = "HARNESS_WARM_SOCKET"
# Set in a zygote itself: it never hands over.
ZYGOTE = "HARNESS_ZYGOTE"
# A full-size run's HF assets folder, which the backends' config functions read (they run
# before torchtitan reads --hf_assets_path; harness/backends/common.py ``full_assets``).
FULL_ASSETS = "HARNESS_FULL_ASSETS"
# The config module harness.launch.instrumented proxies.
INSTRUMENT_TARGET = "HARNESS_INSTRUMENT_TARGET"

# ---- the harness's own processes
# A child pytest's reports file; set, it runs its own_process tests itself
# (harness/launch/own_process.py).
OWN_PROCESS_REPORTS = "HARNESS_OWN_PROCESS_REPORTS"
# Set: a full-size run's checkpoints outlive its checks (harness/checks/run_checks.py).
KEEP_CHECKPOINTS = "HARNESS_KEEP_CHECKPOINTS"
# "cpu": the neuron tier runs its launches on the cpu profile (the nightly's rehearsal).
NEURON_STANDIN = "HARNESS_NEURON_STANDIN"
# The default of pytest's --c4-path (conftest.py).
C4_PATH = "HARNESS_C4_PATH"

# What a rank reads and no other child may inherit: ``child_environment`` sets exactly the ones
# a rank child names and drops the rest.
RANK_ONLY = (SHIMS, PLANTS, OBSERVERS, WARM_SOCKET, ZYGOTE)

# This process's session: what every process it starts carries in ``SESSION``.
SESSION_ID = f"{os.getpid()}-{os.urandom(6).hex()}"


def act_for_parent() -> None:
    """Mark what this process starts with the session of the process that started it (whose
    environment carries ``SESSION``): for a helper that launches on a session's behalf (the
    launch prefetcher, harness/launch/prefetch.py), so that session's end finds its runs too."""
    global SESSION_ID
    SESSION_ID = os.environ[SESSION]


def names(value: str | None) -> list[str]:
    """The names a comma-separated variable's ``value`` holds."""
    return [n for n in (value or "").split(",") if n]


def child_environment(*, rank: bool = False, shims=(), plants=(), observers=(), python_path=(),
                      base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of a process the harness starts: ``base`` (default: this process's),
    this tree on the path before what ``base`` had there, none of a rank's own variables
    (``RANK_ONLY``), then ``extra``, and the session's marker last.

    ``rank``: the child starts as a launched rank starts: the boot folder (harness/rank/boot)
    first on its path, then ``python_path``; exactly the named ``shims``, ``plants`` and
    ``observers`` (none inherited); unbuffered output."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in RANK_ONLY}
    path = [*python_path, str(paths.REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
    if rank:
        path.insert(0, str(paths.BOOT_DIR))
        env["PYTHONUNBUFFERED"] = "1"
        for variable, named in ((SHIMS, shims), (PLANTS, plants), (OBSERVERS, observers)):
            if named:
                env[variable] = ",".join(named)
    elif shims or plants or observers or python_path:
        raise ValueError("shims, plants, observers and a python path are a rank child's "
                         "(rank=True)")
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(extra)
    env[SESSION] = SESSION_ID
    return env

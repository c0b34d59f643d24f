"""The processes a harness session starts, and the marker that finds them again.

Every process the harness starts (torchrun and its ranks, a diagnosis walk, a child pytest of an
in-process device test, a random-init forward) inherits ``SESSION_ENV=SESSION_ID``; at the end of
a pytest session anything still running with this session's marker, and nothing else, is killed
and fails the session (conftest.py). ``marked_env`` is the one way to give a child its
environment.
"""

from __future__ import annotations

import os
import uuid

import psutil

SESSION_ENV = "HARNESS_LAUNCHER_SESSION"
SESSION_ID = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def act_for_parent() -> None:
    """Mark what this process starts with the session of the process that started it (whose
    environment carries ``SESSION_ENV``): for a helper that launches on a session's behalf (the
    launch prefetcher, harness/launch/prefetch.py), so that session's end finds its runs too."""
    global SESSION_ID
    SESSION_ID = os.environ[SESSION_ENV]


def marked_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (default: this process's environment) with the session's marker and ``extra``."""
    return {**(os.environ if base is None else base), **extra, SESSION_ENV: SESSION_ID}


def leftover_processes(session_id: str = SESSION_ID) -> list[psutil.Process]:
    """Processes still running that this harness session started (found by the marker every
    child inherits; unrelated processes are never matched)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(SESSION_ENV) == session_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found

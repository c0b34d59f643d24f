"""The processes a harness session started, found again by the marker every one of them
carries (harness/registry/environment.py ``child_environment``, the one way to give a child its
environment): at the end of a pytest session anything still running with this session's
marker, and nothing else, is killed and fails the session (conftest.py).
"""

from __future__ import annotations

import os

import psutil

from harness.registry import environment


def leftover_processes(session_id: str | None = None) -> list[psutil.Process]:
    """Processes still running that this harness session (or ``session_id``'s) started, found
    by the marker every child inherits; unrelated processes are never matched."""
    session_id = session_id or environment.SESSION_ID
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(environment.SESSION) == session_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found

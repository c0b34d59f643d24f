"""The end-of-session sweep ends only what this session launched.

Every launched process inherits the session's marker (harness/registry/environment.py ``SESSION``); a
process that merely mentions the session's folders on its command line is never touched.
"""

import os
import subprocess
import sys

from harness.launch.children import leftover_processes
from harness.registry import environment

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _start(marker: str | None, tmp_path):
    env = dict(os.environ)
    env.pop(environment.SESSION, None)
    if marker:
        env[environment.SESSION] = marker
    return subprocess.Popen([*SLEEP, str(tmp_path)], env=env)


def test_finds_what_this_session_launched_and_nothing_else(tmp_path):
    ours = _start(environment.SESSION_ID, tmp_path)
    stranger = _start(None, tmp_path)  # same folder on its command line, not launched by us
    other_session = _start("another-session", tmp_path)
    try:
        found = {p.pid for p in leftover_processes()}
        assert ours.pid in found
        assert stranger.pid not in found and other_session.pid not in found
    finally:
        for proc in (ours, stranger, other_session):
            proc.kill()
            proc.wait()
    assert ours.pid not in {p.pid for p in leftover_processes()}

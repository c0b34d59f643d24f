"""The launcher's zygotes: processes that have imported what a CPU rank imports, from which
torchrun's workers have their ranks forked (harness/rank/warm_start.py).

``socket_for(env, device_shims)`` gives the socket of the zygote for a run's rank environment,
starting one on first use: its environment is the rank's without the run's own variables
(``zygote_environment``), so one zygote serves every run whose ranks would import alike. A
process keeps at most ``MAX_ZYGOTES``; past that, and wherever a zygote cannot start, the ranks
start cold (the launch goes on unchanged). ``stop_all`` ends them (at exit, and at the end of a
pytest session before the check that nothing it started is left running); a zygote also ends
by itself, with every rank it forked, once the process that started it is gone.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.rank.warm_start import IMPORTED_ENV, MODULES_FILE, STARTED_COLD, STARTED_WARM, USED_CPU, per_run, refusal
from harness.registry import environment

MAX_ZYGOTES = 4
START_TIMEOUT_S = 180.0  # its imports, on 2 busy cores


@dataclass
class Zygote:
    process: subprocess.Popen
    folder: Path
    socket: str
    log: Path
    env: dict  # as it started
    imported_env: dict  # what its imports set in its environment
    modules: frozenset = frozenset()  # what it imported before serving

    def serves(self, rank_env: dict[str, str]) -> bool:
        """Whether it forks ranks of ``rank_env`` (torchrun's own variables aside)."""
        return self.process.poll() is None and refusal(self.env, rank_env, self.imported_env) is None

    def too_late_for(self, patched: frozenset) -> str:
        """Why a run that patches the modules ``patched`` must start cold here ("" if not): its
        patch of a module the zygote imported would act after the import, not as a cold rank's."""
        late = sorted(patched & self.modules)
        return (f"the run patches {', '.join(late)}, which the zygote imported before the run's "
                "patches could act on it") if late else ""


_ZYGOTES: list[Zygote] = []
_PENDING: list[Zygote] = []  # started (``prestart``), not yet known to serve
_FAILED: set[frozenset] = set()  # environments whose zygote could not start: their ranks start cold


def prestart(rank_env: dict[str, str], device_shims: tuple[str, ...]) -> None:
    """Start the zygote for ``rank_env`` now and return at once (it imports while the caller
    goes on, e.g. while pytest collects); the first ``socket_for`` waits for it."""
    if not _ZYGOTES and not _PENDING and not _FAILED:
        _PENDING.append(_spawn(zygote_environment(rank_env, device_shims)))


def zygote_environment(rank_env: dict[str, str], device_shims: tuple[str, ...]) -> dict[str, str]:
    """A zygote's environment for ranks of ``rank_env``: without the run's own variables
    (``HARNESS_*``, the session marker kept), with the device's shims only (the run's others
    are installed in the forked rank)."""
    env = {k: v for k, v in rank_env.items() if k == environment.SESSION or not per_run(k)}
    env.pop(environment.WARM_SOCKET, None)
    if device_shims:
        env[environment.SHIMS] = ",".join(device_shims)
    env[environment.ZYGOTE] = "1"
    return env


def socket_for(rank_env: dict[str, str], device_shims: tuple[str, ...],
               patched: frozenset = frozenset()) -> tuple[str | None, str]:
    """(the socket of a serving zygote for ``rank_env``, started now if need be, ""); or
    (None, why the ranks start cold). ``patched``: the modules the run's own shims and plants
    act on as they are imported (beyond the device's, which the zygote installed first)."""
    while _PENDING:
        zygote = _PENDING.pop()
        if _ready(zygote):
            _ZYGOTES.append(zygote)
        else:
            _FAILED.add(frozenset(zygote.env.items()))
    # A serving zygote takes any rank it would not refuse: the launcher's own environment grows
    # as its process imports (inductor sets its cache folder), and so did the zygote's.
    for zygote in _ZYGOTES:
        if zygote.serves(rank_env):
            late = zygote.too_late_for(patched)
            return (None, late) if late else (zygote.socket, "")
    env = zygote_environment(rank_env, device_shims)
    key = frozenset(env.items())
    if key in _FAILED:
        return None, "this environment's zygote failed to start"
    serving = [z for z in _ZYGOTES if z.process.poll() is None]
    if len(serving) >= MAX_ZYGOTES:
        return None, (f"{MAX_ZYGOTES} zygotes serve other environments; this one differs from the "
                      f"first: {refusal(serving[0].env, rank_env, serving[0].imported_env)}")
    zygote = _spawn(env)
    if not _ready(zygote):
        _FAILED.add(key)
        return None, "its zygote failed to start"
    _ZYGOTES.append(zygote)
    late = zygote.too_late_for(patched)
    return (None, late) if late else (zygote.socket, "")


def _spawn(env: dict[str, str]) -> Zygote:
    if not _ZYGOTES and not _PENDING and not _FAILED:
        atexit.register(stop_all)
    # An empty folder of its own: the zygote's -m puts it first on the path while it imports;
    # short, for the socket's path (108 bytes at most).
    folder = Path(tempfile.mkdtemp(prefix="hz-", dir="/tmp" if os.path.isdir("/tmp") else None))
    socket_path = str(folder / "s")
    log = Path(tempfile.mkstemp(prefix="harness-zygote-", suffix=".log")[1])
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-u", "-m", "harness.rank.warm_start", socket_path],
            cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    return Zygote(process, folder, socket_path, log, env, {})


def _ready(zygote: Zygote) -> bool:
    """Wait until ``zygote`` serves (True), or has failed to start (False, said on stderr)."""
    process, socket_path, log = zygote.process, zygote.socket, zygote.log
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        said = log.read_text(errors="replace")
        if os.path.exists(socket_path) and "serving" in said:
            for line in said.splitlines():
                if line.startswith(IMPORTED_ENV):
                    zygote.imported_env = json.loads(line[len(IMPORTED_ENV):])
            zygote.modules = frozenset((zygote.folder / MODULES_FILE).read_text().split())
            return True
        time.sleep(0.05)
    said = log.read_text(errors="replace")[-400:]
    _stop(zygote)
    print(f"harness: no warm zygote ({said!r}); its ranks start cold", file=sys.stderr)
    return False


def _stop(zygote: Zygote) -> None:
    if zygote.process.poll() is None:
        zygote.process.terminate()
        try:
            zygote.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            zygote.process.kill()
            zygote.process.wait()
    shutil.rmtree(zygote.folder, ignore_errors=True)
    zygote.log.unlink(missing_ok=True)


def stop_all() -> None:
    """End every zygote this process started (and the ranks they forked)."""
    while _ZYGOTES or _PENDING:
        _stop((_ZYGOTES or _PENDING).pop())


def zygote_pids() -> set[int]:
    """The zygotes this process keeps (not leftovers while it keeps them; their ranks are)."""
    return {z.process.pid for z in _ZYGOTES if z.process.poll() is None}


def started_warm(rank_logs: dict[int, list[Path]], why_cold: str = "") -> dict:
    """How the ranks of a launch started, from their stderr: {"warm": n, "cold": m,
    "warm_cpu_s": what the forked ranks used (the zygote's CPU, not the launcher's children's),
    "why_cold": the first cold rank's reason (``why_cold``: the launcher's, if it had no zygote)}."""
    counts = {"warm": 0, "cold": 0, "warm_cpu_s": 0.0, "why_cold": why_cold}
    for files in rank_logs.values():
        text = "".join(p.read_text(errors="replace") for p in files if p.is_file())
        counts["warm" if STARTED_WARM in text else "cold"] += 1
        for line in text.splitlines():
            if line.startswith(USED_CPU):
                counts["warm_cpu_s"] += float(line[len(USED_CPU):])
            elif line.startswith(STARTED_COLD) and not counts["why_cold"]:
                counts["why_cold"] = line[len(STARTED_COLD):].strip()
    counts["warm_cpu_s"] = round(counts["warm_cpu_s"], 2)
    return counts

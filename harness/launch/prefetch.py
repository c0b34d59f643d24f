"""Launch a test session's runs ahead of need, beside the ones its workers launch.

A CPU launch mostly waits: torchrun's rendezvous, the checkpoint writes, torchtitan's pause on
rank 0. A tiny 2-rank launch keeps about half a core busy over its life, so a session whose
workers both wait on launches leaves the machine half idle. The prefetcher is one more lane: a
process that goes through the runs the session's collected tests will read, in the order the
tests come, and launches each one that is neither stored nor being launched
(``RunCache.prefetch``). A test that reaches a run it is launching waits for it, as it would for
another worker; a run it has not reached is launched by the test's worker as before. Its
results are the run cache's, bit for bit what the worker would have launched (the same
``RunSpec``, the same launcher).

Which runs: the tests' parameters that name a run of the run matrix (``NEEDS``: a parameter
name and the spec its fixture launches for it), on this device, tiny, in tests not marked to
skip (a user's ``--subject`` config is left to its test). Each spec is the fixture's own
function of the case, so the two cannot drift; a run launched ahead and read by no test fails
the session (``run_cache.unread_prefetches``).

``start`` runs in one process of the session (the first pytest-xdist worker to claim it);
``stop`` at that process's end lets the run in flight finish (a test may be waiting for it)
and starts no other; an interrupted session ends it at once. Device profiles opt in
(``DeviceProfile.prefetch``: CPU only).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

from filelock import FileLock, Timeout

from harness.device.devices import profile_for
from harness.launch import warm
from harness.launch.run_cache import RunCache
from harness.registry import dump_layout, environment

STOP_GRACE_S = 900.0  # the run in flight finishes (its own timeout bounds it)


def needed_specs(items, device: str, steps: int, workarounds: tuple[str, ...]) -> list:
    """The RunSpecs the collected ``items`` will read through their run parameters (``NEEDS``),
    on ``device``, in the order the items come, each once."""
    specs = []
    for item in items:
        if any(item.iter_markers("skip")) or any(item.iter_markers("skipif")):
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        for name, spec_of in NEEDS.items():
            case = params.get(name)
            if case is None or getattr(case, "device", None) != device or getattr(case, "size", "tiny") != "tiny":
                continue
            spec = spec_of(case, steps, workarounds)
            if spec is not None and spec not in specs:
                specs.append(spec)
    return specs


def _template_spec(case, steps, workarounds):
    """tests/e2e/conftest.py launched_run; a user's config function (``--subject``, a
    ``SubjectCase``) is launched by its own test: its spec imports the user's module."""
    if not hasattr(case, "suite_spec"):
        return None
    return case.suite_spec(steps, workarounds=workarounds)


def _layout_spec(case, steps, workarounds):
    return case.run_spec(steps, workarounds)  # tests/parity/test_layouts.py layout_run


# A test parameter naming a run, and the spec its fixture launches for it.
NEEDS = {
    "run_case": _template_spec,
    "published_case": _template_spec,
    "layout_case": _layout_spec,
    "fsdp_layout_case": _layout_spec,
    "moe_fsdp_layout_case": _layout_spec,
}


class Prefetcher:
    """The prefetching process of a session, started by ``start``."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def stop(self, at_once: bool = False) -> None:
        """Start no other run; let the one in flight finish, unless ``at_once``."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM if at_once else signal.SIGUSR1)
        try:
            self.process.wait(timeout=10.0 if at_once else STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGTERM)  # its launcher ends the run's processes
            try:
                self.process.wait(timeout=30.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start(cache_root: Path, kind: str, specs: list) -> Prefetcher | None:
    """Start the session's prefetcher for ``specs`` on device ``kind``, whose run cache is
    ``cache_root``; None where another process of the session has started it, or there is
    nothing to launch."""
    root = Path(cache_root)
    root.mkdir(parents=True, exist_ok=True)
    if not specs:
        return None
    try:
        claim = dump_layout.prefetch_claim(root)
        with FileLock(str(dump_layout.lock_file(claim)), blocking=False):
            if claim.exists():
                return None
            claim.write_text(str(os.getpid()))
    except Timeout:
        return None
    dump_layout.prefetch_specs(root).write_bytes(pickle.dumps((kind, list(specs))))
    log = open(dump_layout.prefetch_log(root), "ab")
    process = subprocess.Popen([sys.executable, "-m", "harness.launch.prefetch", str(root)],
                               env=environment.child_environment(), stdin=subprocess.DEVNULL,
                               stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return Prefetcher(process)


def main(cache_root: str) -> int:
    """The prefetching process: launch each spec that nobody has launched, in order, until
    done or told to stop (SIGUSR1: after the run in flight; SIGTERM: now)."""
    environment.act_for_parent()  # its runs are the session's: the session's end finds them
    stop = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append("usr1"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the launcher's finally ends the run
    root = Path(cache_root)
    kind, specs = pickle.loads(dump_layout.prefetch_specs(root).read_bytes())

    try:
        launched = prefetch_all(RunCache(profile_for(kind), root), specs, stop)
    finally:
        warm.stop_all()
    print(f"prefetch: {len(launched)} of {len(specs)} runs launched ahead of need", flush=True)
    return 0


def prefetch_all(cache, specs: list, stop: list) -> list:
    """Launch, in order, each of ``specs`` that ``cache`` has neither stored nor in flight,
    until ``stop`` holds anything (checked between launches); the specs it launched."""
    launched = []
    for spec in specs:
        if stop:
            break
        if cache.prefetch(spec):
            launched.append(spec)
            print(f"prefetch: launched {spec.name}", flush=True)
    return launched


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Launch each distinct run once per pytest session and share its result, across processes.

Every pytest-xdist worker of a session opens a ``RunCache`` on the same folder (the session's
shared temporary root). A run's folder is keyed by a digest of its whole ``RunSpec``; the first
process to ask for it launches it while holding a file lock on that key, and stores the result
beside the folder; every other process, waiting on the lock or coming later, reads the stored
result (the folder and what is kept beside it: harness/registry/dump_layout.py). Each launch
appends one line to the folder's ledger (``dump_layout.ledger``), which
``repeated_launches`` reads: a session in which one spec was launched twice is a defect, and
so is one whose specs differ only in a worker's own temporary folder (an input built per
worker, e.g. under ``popen-gw0/`` and ``popen-gw1/``, makes each worker launch its own copy of
the same run: ``shared_folder`` builds such inputs once, where every worker finds them).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import resource
import shutil
import time
from dataclasses import replace
from pathlib import Path

from filelock import FileLock, Timeout

from harness.device.devices import DeviceProfile
from harness.launch.run import RunSpec, launch
from harness.registry import dump_layout
from harness.results.run_result import RunResult

# A pytest-xdist worker's own basetemp under the session's root (``<root>/popen-gwN``).
WORKER_FOLDER = re.compile(r"popen-gw\d+")


def session_root(tmp_path_factory) -> Path:
    """The session's temporary root, the same for every pytest-xdist worker (a worker's own
    basetemp is ``<root>/popen-gwN``)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_folder(tmp_path_factory, name: str, build) -> Path:
    """``<session root>/<name>``, made by ``build(path)`` once per session whichever worker asks
    first (the others wait for it): a path that goes into a RunSpec must be the same on every
    worker, or each worker launches the run again."""
    path = session_root(tmp_path_factory) / name
    done = path.with_name(name + ".built")
    with FileLock(str(dump_layout.lock_file(path))):
        if not done.is_file():
            shutil.rmtree(path, ignore_errors=True)  # a build cut short
            build(path)
            done.touch()
    return path


def spec_key(spec: RunSpec) -> str:
    """The spec's digest with every worker's own folder spelled alike: two launches with one key
    are one run launched twice."""
    return hashlib.sha1(WORKER_FOLDER.sub("popen-gw*", repr(spec)).encode()).hexdigest()[:10]


class RunCache:
    def __init__(self, profile: DeviceProfile, root: Path,
                 rendezvous: tuple[str, ...] = ()) -> None:
        self.profile = profile
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.rendezvous = rendezvous  # torchrun options for multi-node runs (--torchrun-arg)
        self._results: dict[RunSpec, RunResult] = {}

    def get(self, spec: RunSpec) -> RunResult:
        spec = self._with_rendezvous(spec)
        if spec not in self._results:
            self._results[spec] = self._shared(spec)
        return self._results[spec]

    def prefetch(self, spec: RunSpec) -> bool:
        """Launch ``spec`` ahead of need (harness/launch/prefetch.py) unless it is stored or
        being launched: whether it launched it. Whoever asks for it next reads its result."""
        try:
            return self._shared(self._with_rendezvous(spec), blocking=False) is not None
        except Timeout:  # another process is launching it
            return False

    def _with_rendezvous(self, spec: RunSpec) -> RunSpec:
        # A run of several nodes starts them all on this machine, with its own rendezvous.
        if self.rendezvous and not spec.rendezvous and spec.nodes == 1:
            spec = replace(spec, rendezvous=self.rendezvous)
        return spec

    def _shared(self, spec: RunSpec, blocking: bool = True) -> RunResult | None:
        run_dir = self.run_dir(spec)
        stored = dump_layout.stored_result(run_dir)
        with FileLock(str(dump_layout.lock_file(run_dir)), blocking=blocking):
            found = read_stored(stored, spec)
            if found is not None:
                if not blocking:
                    return None
                dump_layout.read_mark(run_dir).touch()
                return found
            before, start = _children_cpu_s(), time.monotonic()
            result = launch(spec, self.profile, run_dir)
            # The launch's whole process tree (torchrun and its ranks, all reaped by now), so
            # the ledger tells what each run costs (scripts/benchmark.py launches); ranks forked
            # from a zygote are its children, and say what they used (harness/launch/warm.py).
            cpu_s, wall_s = _children_cpu_s() - before, time.monotonic() - start
            cpu_s += result.started.get("warm_cpu_s", 0.0)
            stored.write_bytes(pickle.dumps(result))
            with open(dump_layout.ledger(self.root), "a", encoding="utf-8") as ledger:
                ledger.write(json.dumps({"run": run_dir.name, "key": spec_key(spec),
                                         "name": spec.name, "pid": os.getpid(),
                                         "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                                         "cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2),
                                         "started": result.started,
                                         "prefetched": not blocking}) + "\n")
            if blocking:
                dump_layout.read_mark(run_dir).touch()
            return result

    def run_dir(self, spec: RunSpec) -> Path:
        # The digest of the whole spec, stable across processes (str hash() is salted per
        # process): the same spec gets the same folder in every worker, and on every node of
        # a multi-node run.
        digest = hashlib.sha1(repr(spec).encode()).hexdigest()[:10]
        return dump_layout.cache_run_dir(self.root, spec.name, digest)


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's reaped children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def read_stored(stored: Path, spec: RunSpec | None = None) -> RunResult | None:
    """The result stored at ``stored``, if it is a result of ``spec`` (any spec: None) in this
    harness's form: None where there is none, or it is another run's or of an older form (a
    result without the spec it ran), which is launched again rather than read as one."""
    if not stored.is_file():
        return None
    try:
        result = pickle.loads(stored.read_bytes())
    except (pickle.UnpicklingError, AttributeError, ImportError, EOFError, TypeError):
        # a form this harness can no longer load (a class or module since renamed)
        return None
    if not isinstance(result, RunResult) or not isinstance(vars(result).get("spec"), RunSpec):
        return None
    return result if spec is None or result.spec == spec else None


def stored_results(root: Path) -> list[RunResult]:
    """Every run the session whose temporary root is ``root`` launched, whichever process
    launched it (each stored its result beside its folder), in launch order. A stored result
    this harness cannot read as one (``read_stored``) is refused, named."""
    entries = {entry["run"]: entry for entry in ledger_entries(root)}
    results = []
    for name in entries:
        for stored in dump_layout.cache_files(root, name, dump_layout.STORED_RESULT):
            result = read_stored(stored)
            if result is None:
                raise ValueError(f"{stored} is not a run result of this harness's form (a result "
                                 f"without the RunSpec it ran): launch its run again")
            results.append(result)
    return results


def ledger_entries(root: Path) -> list[dict]:
    """Every launch of the session whose temporary root is ``root``: by the shared caches
    (``<root>/<kind>_runs``) or by caches a worker kept to itself (``<root>/popen-gwN/<kind>_runs``)."""
    return [json.loads(line) for ledger in dump_layout.ledgers(root)
            for line in ledger.read_text().splitlines() if line]


def repeated_launches(root: Path) -> dict[str, int]:
    """``{run folder(s): launches}`` for every run launched more than once in the session whose
    temporary root is ``root``: by the shared caches (``<root>/<kind>_runs``), by caches a
    worker kept to itself (``<root>/popen-gwN/<kind>_runs``), or as specs that differ only in a
    worker's own folder (``spec_key``)."""
    folders: dict[str, list[str]] = {}
    for entry in ledger_entries(root):
        folders.setdefault(entry.get("key") or entry["run"], []).append(entry["run"])
    return {" = ".join(sorted(set(runs))): len(runs) for runs in folders.values() if len(runs) > 1}


def unread_prefetches(root: Path) -> list[str]:
    """The runs the session whose temporary root is ``root`` launched ahead of need
    (harness/launch/prefetch.py) that no test then read: each is a launch the session paid for
    and used nowhere, i.e. the prefetcher's spec of a test differs from the test's own."""
    return [entry["run"] for entry in ledger_entries(root) if entry.get("prefetched")
            and not dump_layout.cache_files(root, entry["run"], dump_layout.READ_MARK)]

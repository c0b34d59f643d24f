"""Benchmark the harness (not a test): suite time, launcher overhead, pytest-xdist gain.

    python scripts/benchmark.py overhead --repeats 3      # harness launch vs bare torchrun
    python scripts/benchmark.py suite                     # default CPU suite
    python scripts/benchmark.py suite --against cf04508 --repeats 2   # side by side, alternating
    python scripts/benchmark.py xdist --paths tests/kernels tests/selftest/test_upstream_shims.py
    python scripts/benchmark.py threads --paths tests/parity/test_forward_parity.py
    python scripts/benchmark.py launches --basetemp DIR   # a session's launches (--basetemp=DIR)
    python scripts/benchmark.py rank-import --backend hf_v5 --repeats 8   # a rank's start-up

Each measurement runs its variants interleaved in one process, so ratios compare like with
like on the same machine state; the script prints the raw times and the ratio. Every time is
given twice: wall seconds, and the user + system CPU seconds of the whole process tree (pytest,
its workers, every torchrun and rank). On a machine others share, wall time is an upper bound
and the CPU seconds are what compares; wall time compares only on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this tree's harness, not whichever copy is pip-installed

from harness.device.devices import detect  # noqa: E402
from harness.launch.run import RunSpec, build_command, launch, rank_environment  # noqa: E402
from harness.launch.run_cache import ledger_entries  # noqa: E402


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _measured(command: list[str], env=None, cwd=None, ok=(0,)) -> tuple[float, float]:
    """(wall s, CPU s of its whole process tree) of ``command``; a suite with failing tests
    (exit 1) still has a time."""
    cpu, start = _children_cpu(), time.monotonic()
    done = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    if done.returncode not in ok:
        raise SystemExit(f"command failed ({done.returncode}): {' '.join(command)}")
    return elapsed, _children_cpu() - cpu


def _timed(command: list[str], env=None, cwd=None, ok=(0,)) -> float:
    return _measured(command, env, cwd, ok)[0]


def _line(label: str, runs: list[tuple[float, float]]) -> str:
    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
    return (f"{label}: wall {[f'{w:.0f}' for w in walls]} s (median {statistics.median(walls):.0f}), "
            f"CPU {[f'{c:.0f}' for c in cpus]} s (median {statistics.median(cpus):.0f})")


def _ratio(label: str, ours: list[tuple[float, float]], theirs: list[tuple[float, float]]) -> str:
    med = lambda runs, i: statistics.median(r[i] for r in runs)  # noqa: E731
    return (f"ratio of medians ({label}): wall {med(ours, 0) / med(theirs, 0):.3f}, "
            f"CPU {med(ours, 1) / med(theirs, 1):.3f}")


def overhead(repeats: int, backend: str, steps: int) -> None:
    """The same run through ``harness.launch.run`` and as a bare torchrun command line."""
    profile = detect("cpu")
    spec = RunSpec(backend=backend, steps=steps)
    harness_times, bare_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            start = time.monotonic()
            result = launch(spec, profile, Path(tmp) / f"harness{i}")
            harness_times.append(time.monotonic() - start)
            assert result.ok, result.log_tails()
            bare_dir = Path(tmp) / f"bare{i}"
            bare_dir.mkdir()
            # Bare torchrun: same module/config/overrides and rank environment (the CPU shims
            # are part of the system under test on CPU), no launcher around it.
            command = [c for c in build_command(spec, profile, bare_dir)
                       if not c.startswith(("--log-dir", "--redirects"))]
            bare_times.append(_timed(command, env=rank_environment(spec, profile), cwd=bare_dir))
    h, b = statistics.median(harness_times), statistics.median(bare_times)
    print(f"harness launch: {[f'{t:.1f}' for t in harness_times]} s, median {h:.1f} s")
    print(f"bare torchrun:  {[f'{t:.1f}' for t in bare_times]} s, median {b:.1f} s")
    print(f"overhead ratio (harness / bare): {h / b:.3f}")


def suite(extra: list[str], against: str | None = None, repeats: int = 1) -> None:
    """The default suite's wall time; with ``against``, that commit's default suite too, from a
    temporary git worktree, alternating with this tree's ``repeats`` times on the same machine
    (each suite imports its own ``harness``: pytest puts the worktree's root first on sys.path,
    and its ranks get the worktree's root on PYTHONPATH)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    if against is None:
        print(_line("default CPU suite", [_measured(command, cwd=REPO, ok=(0, 1)) for _ in range(repeats)]))
        return
    theirs, ours = [], []
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other), against],
                       check=True, stdout=subprocess.DEVNULL)
        try:
            for _ in range(repeats):
                theirs.append(_measured(command, cwd=other, ok=(0, 1)))
                print(_line(f"  {against}", theirs[-1:]), flush=True)
                ours.append(_measured(command, cwd=REPO, ok=(0, 1)))
                print(_line("  here", ours[-1:]), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)],
                           check=False)
    print(_line(f"default CPU suite at {against}", theirs))
    print(_line("default CPU suite here", ours))
    print(_ratio(f"here / {against}", ours, theirs))


def threads(paths: list[str], counts: list[int], repeats: int) -> None:
    """A selection in one process at each intra-op thread count (``OMP_NUM_THREADS``),
    alternating: what a pytest-xdist worker's share of the cores costs and gains (conftest.py)."""
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *paths]
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in counts}
    for _ in range(repeats):
        for n in counts:
            runs[n].append(_measured(base, env=dict(os.environ, OMP_NUM_THREADS=str(n)), cwd=REPO))
    for n in counts:
        print(_line(f"{n} thread(s)", runs[n]))


def rank_import(backend: str, repeats: int) -> None:
    """A launched CPU rank of ``backend`` up to torchtitan's first collection: what it imports
    before the trainer exists (``torchtitan.train`` and the backend's config module, under the
    rank's shims), then what ``Trainer.__init__`` does first (the start-up collection setting
    resumed, torchtitan's ``GarbageCollection``: ``gc.disable()`` and ``gc.collect(1)``). With
    the rank's start-up collection setting (harness/rank/startup_gc.py: ``LOCAL_RANK`` set, as
    torchrun sets it) and without it, alternating."""
    spec = RunSpec(backend=backend, steps=1)
    env = {k: v for k, v in rank_environment(spec, detect("cpu")).items() if k != "LOCAL_RANK"}
    command = [sys.executable, "-c",
               f"import gc, torchtitan.train, harness.backends.{backend}, harness.rank.startup_gc as s\n"
               "if not gc.isenabled(): s.resume_frozen()  # as the hook on Trainer.__init__ does\n"
               "gc.disable(); gc.collect(1)  # torchtitan's GarbageCollection.__init__"]
    deferred, plain = [], []
    for _ in range(repeats):
        deferred.append(_measured(command, env=dict(env, LOCAL_RANK="0"), cwd=REPO))
        plain.append(_measured(command, env=env, cwd=REPO))
    print(_line("rank start-up, collection off until the trainer, then frozen", deferred))
    print(_line("rank start-up, Python's automatic collection", plain))
    print(_ratio("deferred / automatic", deferred, plain))


def xdist(paths: list[str], workers: int) -> None:
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths]
    serial = _timed(base + ["-n", "0"], cwd=REPO)
    parallel = _timed(base + ["-n", str(workers)], cwd=REPO)
    print(f"serial {serial:.0f} s, -n {workers} {parallel:.0f} s, gain x{serial / parallel:.2f}")


def launches(basetemp: Path) -> None:
    """Every run a pytest session launched (its run cache ledger, harness/launch/run_cache.py): CPU and
    wall seconds of each launch's process tree, the worker that launched it, and how many
    times each distinct RunSpec launched."""
    entries = ledger_entries(basetemp)
    if not entries:
        raise SystemExit(f"no launch ledger under {basetemp} (run pytest with --basetemp={basetemp})")
    counts = Counter(e["run"] for e in entries)
    for e in sorted(entries, key=lambda e: -e.get("cpu_s", 0)):
        print(f"{e.get('cpu_s', float('nan')):7.1f} CPU s {e.get('wall_s', float('nan')):7.1f} wall s "
              f"{e.get('worker') or '-':4} x{counts[e['run']]} {e['run']}")
    print(f"{len(entries)} launches of {len(counts)} distinct RunSpecs; "
          f"{sum(e.get('cpu_s', 0) for e in entries):.0f} CPU s, "
          f"{sum(e.get('wall_s', 0) for e in entries):.0f} wall s; by worker: "
          f"{dict(Counter(e.get('worker') or '-' for e in entries))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--repeats", type=int, default=3)
    o.add_argument("--backend", default="titan_native")
    o.add_argument("--steps", type=int, default=10)
    s = sub.add_parser("suite")
    s.add_argument("extra", nargs="*")
    s.add_argument("--against", metavar="REV", help="also time this commit's suite, side by side")
    s.add_argument("--repeats", type=int, default=1)
    x = sub.add_parser("xdist")
    x.add_argument("--paths", nargs="+", default=["tests"])
    x.add_argument("--workers", type=int, default=2)
    t = sub.add_parser("threads")
    t.add_argument("--paths", nargs="+", default=["tests/parity/test_forward_parity.py"])
    t.add_argument("--counts", nargs="+", type=int, default=[2, 1])
    t.add_argument("--repeats", type=int, default=2)
    ln = sub.add_parser("launches")
    ln.add_argument("--basetemp", type=Path, required=True)
    ri = sub.add_parser("rank-import")
    ri.add_argument("--backend", default="hf_v5")
    ri.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    if args.what == "overhead":
        overhead(args.repeats, args.backend, args.steps)
    elif args.what == "suite":
        suite(args.extra, args.against, args.repeats)
    elif args.what == "launches":
        launches(args.basetemp)
    elif args.what == "threads":
        threads(args.paths, args.counts, args.repeats)
    elif args.what == "rank-import":
        rank_import(args.backend, args.repeats)
    else:
        xdist(args.paths, args.workers)


if __name__ == "__main__":
    main()

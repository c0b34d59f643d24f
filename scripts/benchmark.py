"""Benchmark the harness (not a test): suite wall time, launcher overhead, pytest-xdist gain.

    python scripts/benchmark.py overhead --repeats 3      # harness launch vs bare torchrun
    python scripts/benchmark.py suite                     # default CPU suite wall time
    python scripts/benchmark.py suite --against cf04508 --repeats 2   # side by side, alternating
    python scripts/benchmark.py xdist --paths tests/kernels tests/selftest/test_upstream_shims.py

Each measurement runs its variants interleaved in one process, so ratios compare like with
like on the same machine state; the script prints the raw times and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.devices import detect
from harness.launch import RunSpec, build_command, launch, rank_environment

REPO = Path(__file__).resolve().parents[1]


def _timed(command: list[str], env=None, cwd=None, ok=(0,)) -> float:
    """Wall time of ``command``; a suite with failing tests (exit 1) still has a time."""
    start = time.monotonic()
    done = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    if done.returncode not in ok:
        raise SystemExit(f"command failed ({done.returncode}): {' '.join(command)}")
    return elapsed


def overhead(repeats: int, backend: str, steps: int) -> None:
    """The same run through ``harness.launch`` and as a bare torchrun command line."""
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
        times = [_timed(command, cwd=REPO, ok=(0, 1)) for _ in range(repeats)]
        print(f"default CPU suite: {[f'{t:.0f}' for t in times]} s, median {statistics.median(times):.0f} s")
        return
    theirs, ours = [], []
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other), against],
                       check=True, stdout=subprocess.DEVNULL)
        try:
            for _ in range(repeats):
                theirs.append(_timed(command, cwd=other, ok=(0, 1)))
                ours.append(_timed(command, cwd=REPO, ok=(0, 1)))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)],
                           check=False)
    t, o = statistics.median(theirs), statistics.median(ours)
    print(f"default CPU suite at {against}: {[f'{x:.0f}' for x in theirs]} s, median {t:.0f} s")
    print(f"default CPU suite here: {[f'{x:.0f}' for x in ours]} s, median {o:.0f} s")
    print(f"ratio of medians (here / {against}): {o / t:.3f}")


def xdist(paths: list[str], workers: int) -> None:
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths]
    serial = _timed(base + ["-n", "0"], cwd=REPO)
    parallel = _timed(base + ["-n", str(workers)], cwd=REPO)
    print(f"serial {serial:.0f} s, -n {workers} {parallel:.0f} s, gain x{serial / parallel:.2f}")


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
    args = parser.parse_args()
    if args.what == "overhead":
        overhead(args.repeats, args.backend, args.steps)
    elif args.what == "suite":
        suite(args.extra, args.against, args.repeats)
    else:
        xdist(args.paths, args.workers)


if __name__ == "__main__":
    main()

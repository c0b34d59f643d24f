#!/usr/bin/env python3
"""Record the multi-step goldens of one device: the tiny dense and MoE runs for 100 steps.

    python3 scripts/record_goldens.py                       # cpu, both runs, this generation
    python3 scripts/record_goldens.py --device neuron --twice
    /work/main/.venv-titan-spring2026/bin/python scripts/record_goldens.py   # the other generation

Each run (harness/launch/goldens.py ``golden_cases``) is launched through the harness's own
launch path (harness/launch/run.py ``launch``) and written to
``tests/assets/losses/<generation>/<device>/<run>.txt`` (torchtitan's ``<step> <loss>`` lines)
with its sidecar ``<run>.json``: the torch and torchtitan versions and the arithmetic identity
that make it reproducible bit for bit (harness/device/arithmetic.py), this command, and where,
when and at what cost it was recorded. ``--twice`` launches every run a second time and records
whether the two curves are the same to the bit (a golden is compared exactly only where they are).
"""

from __future__ import annotations

import argparse
import datetime
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.device import arithmetic
from harness.device.devices import KINDS, profile_for
from harness.launch.goldens import GOLDEN_BACKENDS, GOLDEN_STEPS, RECORD_COMMAND, GoldenCase
from harness.launch.run import launch
from harness.registry import paths
from harness.results import goldens
from harness.upstream.titan_api import generation
from harness.upstream.versions import code_commit, package_versions


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launched_losses(case: GoldenCase, run_dir: Path) -> tuple[list[float], list, float, float]:
    """(losses, learning rates, CPU s, wall s) of one launch of ``case``'s golden run; a failed run stops here."""
    profile = profile_for(case.device)
    cpu, wall = _children_cpu_s(), time.monotonic()
    result = launch(case.spec, profile, run_dir)
    cpu, wall = _children_cpu_s() - cpu, time.monotonic() - wall
    if result.returncode != 0 or result.timed_out or len(result.steps) != case.spec.steps:
        raise SystemExit(f"{case.spec.name}: exit {result.returncode}, timed out {result.timed_out}, "
                         f"{len(result.steps)} of {case.spec.steps} steps; logs under {run_dir}")
    return [s.loss for s in result.steps], [s.lr for s in result.steps], cpu, wall


def sidecar(case: GoldenCase, lrs: list, cpu_s: float, wall_s: float,
            rerun_identical: bool | None) -> dict:
    versions = package_versions()
    return {
        "run": case.spec.name,
        "steps": case.spec.steps,
        "device": case.device,
        "generation": generation(),
        "reproducible_by": {"torch": versions.get("torch"), "torchtitan": versions.get("torchtitan"),
                            "arithmetic": arithmetic.identity(case.device)},
        "regenerate": RECORD_COMMAND.format(device=case.device),
        # The learning rate of every step: a shorter run shares the golden's first losses up to
        # the first step whose rate depends on the run's length (the decay after warmup).
        "lr": lrs,
        "recorded": {
            "date": datetime.date.today().isoformat(),
            "commit": code_commit(),
            "cpu model": arithmetic.cpu_model(),
            "versions": versions,
            "ranks": case.spec.ranks(profile_for(case.device)),
            "cpu_s": round(cpu_s, 1),
            "wall_s": round(wall_s, 1),
            "rerun bitwise identical": rerun_identical,
        },
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=KINDS, default="cpu")
    parser.add_argument("--backends", nargs="+", choices=GOLDEN_BACKENDS, default=list(GOLDEN_BACKENDS))
    parser.add_argument("--twice", action="store_true",
                        help="launch every run twice and record whether the curves are the same bits")
    parser.add_argument("--root", type=Path, default=paths.GOLDENS, help="the goldens' root folder")
    parser.add_argument("--workdir", type=Path, default=None, help="where the runs' folders go")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="goldens-"))
    for backend in args.backends:
        case = GoldenCase(backend, args.device)
        assert case.spec.steps == GOLDEN_STEPS
        losses, lrs, cpu_s, wall_s = launched_losses(case, workdir / case.spec.name)
        identical = None
        if args.twice:
            again, _, _, _ = launched_losses(case, workdir / f"{case.spec.name}.again")
            comparison = goldens.compare(case.spec.name, again, losses)
            identical = comparison.ok
            print(comparison.message().split("\nthis run's curve")[0])
        path = goldens.write(case.path(generation(), args.root), losses,
                             sidecar(case, lrs, cpu_s, wall_s, identical))
        print(f"{path}: {len(losses)} steps, {cpu_s:.0f} CPU s, {wall_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m harness run``: launch the backends on the device and report their losses."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness.backends import BACKENDS, SIZES, model_name
from harness.devices import KINDS, detect
from harness.expectations import ExpectationRegistry, MissingExpectation
from harness.launch import INITS, RunSpec, launch


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the backends and print their losses")
    run.add_argument("--device", choices=KINDS, default=None)
    run.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    run.add_argument("--inits", nargs="+", choices=INITS, default=["pretrained"])
    run.add_argument("--steps", type=int, default=10)
    run.add_argument("--profile", choices=SIZES, default="tiny")
    run.add_argument("--assets-dir", default=None, help="HF assets dir (full profile)")
    run.add_argument("--output-dir", default=None, help="where run folders go (default: a temp dir)")
    run.add_argument("--workaround", action="append", default=[], metavar="SHIM")
    return parser


def run(args: argparse.Namespace) -> int:
    profile = detect(args.device)
    out = Path(args.output_dir or tempfile.mkdtemp(prefix="harness-"))
    registry = ExpectationRegistry()
    print(f"device: {profile.describe()}\nrun folders: {out}", flush=True)
    failures = 0
    rows = []
    for backend in args.backends:
        for init in args.inits:
            spec = RunSpec(backend=backend, size=args.profile, init=init, steps=args.steps,
                           hf_assets_path=args.assets_dir, workarounds=tuple(args.workaround))
            print(f"running {spec.name} ...", flush=True)
            result = launch(spec, profile, out / spec.name)
            first = result.steps[0].loss if result.steps else float("nan")
            last = result.steps[-1].loss if result.steps else float("nan")
            try:
                expectation = registry.get(backend, model_name(backend, args.profile), init,
                                           profile.kind)
                problem = expectation.check(first)
                verdict = "ok" if problem is None and result.ok else "FAIL"
                expected = f"{expectation.value:.4f}"
            except MissingExpectation:
                problem, verdict, expected = None, ("ok" if result.ok else "FAIL"), "n/a"
            failures += verdict == "FAIL"
            rows.append((spec.name, f"{first:.6f}", expected, f"{last:.6f}", str(len(result.steps)),
                         f"{result.duration_s:.0f}s", verdict))
            if not result.ok:
                print(result.log_tails(15))
    header = ("run", "step-1 loss", "expected", "final loss", "steps", "time", "verdict")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

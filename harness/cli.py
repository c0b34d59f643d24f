"""``python -m harness run``: run the backends on the device, check them, write a report."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness import checks, known_issues
from harness.backends import BACKENDS, INITS, SIZES
from harness.devices import KINDS, detect
from harness.launch import RunSpec, launch, package_versions
from harness.report import RunVerdict, format_table, table_rows, write_report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the backends, check them, write a report")
    run.add_argument("--device", choices=KINDS, default=None, help="default: detected")
    run.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    run.add_argument("--inits", nargs="+", choices=INITS, default=["pretrained"])
    run.add_argument("--steps", type=int, default=10)
    run.add_argument("--profile", choices=SIZES, default="tiny")
    run.add_argument("--assets-dir", default=None,
                     help="full profile: dir holding Qwen3-4B-Instruct-2507/ (HF assets)")
    run.add_argument("--output-dir", default="reports/latest", help="report folder")
    run.add_argument("--workaround", action="append", default=[],
                     choices=sorted(known_issues.WORKAROUNDS),
                     help="apply the workaround of a known upstream defect (harness/known_issues.py)")
    return parser


def run(args: argparse.Namespace) -> int:
    profile = detect(args.device)
    out = Path(args.output_dir).resolve()
    versions = package_versions()
    print(f"device: {profile.describe()}\nversions: {versions}\nreport: {out}", flush=True)
    verdicts = []
    for backend in args.backends:
        for init in args.inits:
            if init not in BACKENDS[backend].size(args.profile).inits:
                print(f"[{backend}] {args.profile} starts only from "
                      f"{BACKENDS[backend].size(args.profile).inits}: skipping init {init}")
                continue
            spec = RunSpec(backend=backend, size=args.profile, init=init, steps=args.steps,
                           save_hf=True, hf_assets_path=args.assets_dir, workarounds=tuple(args.workaround))
            start = time.monotonic()
            print(f"[{spec.name}] launching {spec.steps} steps ...", flush=True)

            def progress(record, name=spec.name, start=start):
                print(f"[{name}] step {record.step:3d}  loss {record.loss:.6f}  "
                      f"({time.monotonic() - start:.0f}s)", flush=True)

            result = launch(spec, profile, out / "runs" / spec.name, on_step=progress)
            verdict = RunVerdict(result, checks.verdicts(result, spec.steps))
            verdicts.append(verdict)
            state = "ok" if verdict.ok else "FAIL"
            print(f"[{spec.name}] {state} in {result.duration_s:.0f}s", flush=True)
            if not result.ok:
                print(result.log_tails(15), flush=True)
    header = {"device": profile.describe(), "profile": args.profile, "steps": str(args.steps),
              **{f"version {k}": v for k, v in versions.items()},
              "workarounds": ", ".join(args.workaround) or "none"}
    write_report(verdicts, out, header)
    print()
    print(format_table(table_rows(verdicts)))
    print(f"\nreport: {out / 'summary.md'}")
    return 0 if all(v.ok for v in verdicts) else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

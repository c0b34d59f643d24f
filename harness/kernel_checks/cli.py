"""Command line: ``python -m harness.kernels list [--run]``, ``replay FILE``, ``calibrate``.

``list`` prints, per operator, each implementation and device and whether it can run on this
machine (and if not, why); with ``--run`` it also runs each runnable one on the op's smallest
case in float32 and says whether it ran and passed.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch


def _smallest_case(op):
    for case in op.cases:
        if case.name == "single_token":
            return case
    return op.cases[0]


def list_implementations(run_them: bool = False) -> str:
    from harness.kernels.findings import finding_for
    from harness.kernels.registry import OPS
    from harness.kernels.runner import run
    from harness.kernels.spec import device_status

    lines = []
    for op in OPS.values():
        lines.append(f"{op.name}: {op.title}  [reference: harness.kernels.references.{op.reference.__name__}; "
                     f"{len(op.cases)} cases; class {op.op_class}]")
        for impl in op.implementations:
            lib_ok, lib_reason = impl.requires()
            for device in impl.devices:
                dev_ok, dev_reason = device_status(device)
                label = f"  {impl.name:24s} {device:8s}"
                if not lib_ok:
                    lines.append(f"{label} skipped: {lib_reason}")
                    continue
                if not dev_ok:
                    lines.append(f"{label} skipped: {dev_reason}")
                    continue
                direction = "fwd+bwd" if impl.backward else "fwd"
                if not run_them:
                    lines.append(f"{label} can run ({direction}) -- {impl.target}")
                    continue
                case = _smallest_case(op)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = run(op, impl, device, case, torch.float32)
                if result.passed:
                    status = "ran: pass"
                elif finding_for(op.name, impl.name, case.name, torch.float32, device):
                    status = "ran: known finding"
                else:
                    status = "ran: FAIL " + "; ".join(c.summary() for c in result.failures)
                lines.append(f"{label} {status} ({direction}, case {case.name}, float32) -- {impl.target}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="which implementations can run here, and why not")
    listing.add_argument("--run", action="store_true", help="also run each on its op's smallest case")
    replay = sub.add_parser("replay", help="re-run a saved failing case")
    replay.add_argument("file", type=Path)
    calibrate = sub.add_parser("calibrate", help="measure the numbers behind tolerances.py")
    calibrate.add_argument("ops", nargs="*")
    args = parser.parse_args(argv)

    if args.command == "list":
        print(list_implementations(args.run))
        return 0
    if args.command == "replay":
        from harness.kernels.diagnostics import replay as do_replay

        result = do_replay(args.file)
        print(result.report())
        return 0 if result.passed else 1
    from harness.kernels.calibrate import main as calibrate_main

    return calibrate_main(args.ops)

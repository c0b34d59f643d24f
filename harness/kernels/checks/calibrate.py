"""Measure the numbers behind the tolerance policy: ``python -m harness.kernels.checks calibrate``.

For every implementation, case, dtype and available device it runs the conformance check with
the arbitration always computed and prints, per (op class, precision):

* ``need_c``: the smallest ``c`` for which rule 1 passes (``max |a-b| / (u * (|b| + rms_row(b)))``
  over elements, via the worst element's ratio to the current bound),
* ``arb``: the largest arbitration ratio (max and rms) among tensors rule 1 rejected,

excluding the checks a known issue excuses (check "kernel" in harness/registry/known_issues/, per
property), which are reported separately with their numbers.
"""

from __future__ import annotations

import argparse
import warnings
from collections import defaultdict

import torch

from harness.kernels.checks.registry import OPS
from harness.kernels.checks.runner import issues_for, run
from harness.kernels.checks.spec import device_status, dtype_name
from harness.registry.tolerances import kernel_tolerance as tolerance

_PRECISIONS = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64)}


def measure(ops=None, devices=("cpu",)):
    rows = []
    for op in OPS.values():
        if ops and op.name not in ops:
            continue
        for impl in op.implementations:
            for device in impl.devices:
                if device not in devices or not impl.requirement(device)()[0] or not device_status(device)[0]:
                    continue
                for case in op.cases:
                    for dtype in case.dtypes:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            result = run(op, impl, device, case, dtype, always_arbitrate=True)
                        rows.append((op, impl, device, case, dtype, result))
    return rows


def summarize(rows) -> str:
    need = defaultdict(float)
    need999 = defaultdict(float)
    arb = defaultdict(float)
    where = {}
    findings = []
    for op, impl, _device, case, dtype, result in rows:
        for check in result.checks:
            finding = issues_for(result, check.name)
            d = check.details
            if "worst_in_tau" not in d:
                continue
            precision_dtype = _PRECISIONS[d["precision"]]
            precision = dtype_name(precision_dtype)
            current = tolerance(op.op_class, precision_dtype)
            needed = d["worst_in_tau"] * current.c
            key = (op.op_class, precision)
            label = f"{op.name}/{impl.name}/{case.name}/{dtype_name(dtype)}/{check.name}"
            if finding:
                findings.append((label, needed, d.get("arbitration", {})))
                continue
            need999[key] = max(need999[key], d.get("p999_in_tau", 0.0) * current.c)
            if needed > need[key]:
                need[key], where[(key, "c")] = needed, label
            a = d.get("arbitration")
            if a and d["mismatched"]:
                ratio = max(a["max_ratio"], a["rms_ratio"])
                if ratio > arb[key]:
                    arb[key], where[(key, "K")] = ratio, label
    lines = ["op class        precision  c_p99.9  c_max     (worst element)     arb_ratio (worst)"]
    for key in sorted(need):
        lines.append(
            f"{key[0]:15s} {key[1]:9s} {need999[key]:8.3g} {need[key]:9.3g}  {where.get((key, 'c'), '')}\n"
            f"{'':36s}arbitration {arb[key]:.3g}  {where.get((key, 'K'), '')}"
        )
    lines.append("")
    lines.append("findings (excluded above):")
    for label, needed, a in findings:
        lines.append(f"  {label}: need_c {needed:.3g}; arbitration max {a.get('max_ratio', float('nan')):.3g}x "
                     f"rms {a.get('rms_ratio', float('nan')):.3g}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.kernels.checks calibrate")
    parser.add_argument("ops", nargs="*", help="restrict to these ops")
    parser.add_argument("--device", action="append", default=None)
    args = parser.parse_args(argv)
    print(summarize(measure(args.ops or None, tuple(args.device or ["cpu"]))))
    return 0

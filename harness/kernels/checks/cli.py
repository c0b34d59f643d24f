"""Command line: ``python -m harness.kernels.checks list [--run]``, ``replay FILE``, ``calibrate``,
``bench OP IMPL [--device D] [--case C] [--dtype T] [--iters N]``.

``bench`` times the forward of one implementation and reports the first call (on Neuron: the
kernel's trace + neuronx-cc compile + load) separately from the steady-state calls (median and
min over ``--iters``): a first call that is slow is a compile, and must not recur per step.

``list`` prints, per operator, each implementation and device and whether it can run on this
machine (and if not, why); with ``--run`` it also runs each runnable one on the op's smallest
case in float32 and says whether it ran and passed.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import torch

from harness.kernels.checks.runner import master_inputs, outcome, round_inputs, run
from harness.kernels.checks.runner import replay as do_replay
from harness.kernels.checks.spec import device_status, torch_device


def _smallest_case(op):
    for case in op.cases:
        if case.name == "single_token":
            return case
    return op.cases[0]


def list_implementations(run_them: bool = False) -> str:
    from harness.kernels.checks.registry import OPS  # noqa: PLC0415  heavy: torchtitan, via the adapters; only some commands need it

    lines = []
    for op in OPS.values():
        lines.append(f"{op.name}: {op.title}  [reference: {op.reference.__module__}.{op.reference.__name__}; "
                     f"{len(op.cases)} cases; class {op.op_class}]")
        for impl in op.implementations:
            for device in impl.devices:
                lib_ok, lib_reason = impl.requirement(device)()
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
                verdict = outcome(result)
                if verdict.status == "pass":
                    status = "ran: pass"
                elif verdict.status == "known":
                    status = "ran: known issue " + ", ".join(i.name for i in verdict.issues)
                else:
                    status = "ran: FAIL " + "; ".join(c.summary() for c in result.failures)
                lines.append(f"{label} {status} ({direction}, case {case.name}, float32) -- {impl.target}")
    return "\n".join(lines)


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "neuron":
        module = getattr(torch, "neuron", None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()


def benchmark(op, impl, device: str, case, dtype: torch.dtype, iters: int = 5, clock=None) -> dict:
    """Forward timings of ``impl`` on ``case``: ``first_call_s`` (includes any compile) and the
    steady-state ``median_s`` / ``min_s`` over ``iters`` further calls (same inputs)."""
    clock = clock or time.perf_counter
    target = torch_device(device)
    inputs = {k: v.to(target) for k, v in round_inputs(op, master_inputs(op.name, case.name), dtype).items()}
    params = dict(case.params)

    def once() -> float:
        start = clock()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            impl.run(inputs, params, device)
        _synchronize(device)
        return clock() - start

    first = once()
    steady = [once() for _ in range(iters)]
    return {"op": op.name, "impl": impl.name, "device": device, "case": case.name, "iters": iters,
            "first_call_s": first, "median_s": statistics.median(steady) if steady else float("nan"),
            "min_s": min(steady) if steady else float("nan")}


def format_benchmark(b: dict) -> str:
    return (f"{b['op']} / {b['impl']} on {b['device']}, case {b['case']}: first call {b['first_call_s'] * 1e3:.3f} ms "
            f"(includes compile), steady state median {b['median_s'] * 1e3:.3f} ms, min {b['min_s'] * 1e3:.3f} ms "
            f"over {b['iters']} calls")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.kernels.checks")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="which implementations can run here, and why not")
    listing.add_argument("--run", action="store_true", help="also run each on its op's smallest case")
    replay = sub.add_parser("replay", help="re-run a saved failing case")
    replay.add_argument("file", type=Path)
    calibrate = sub.add_parser("calibrate", help="measure the numbers behind tolerances.py")
    calibrate.add_argument("ops", nargs="*")
    bench = sub.add_parser("bench", help="first-call (compile) vs steady-state forward time")
    bench.add_argument("op")
    bench.add_argument("impl")
    bench.add_argument("--device", default="cpu")
    bench.add_argument("--case", default=None)
    bench.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    bench.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)

    if args.command == "bench":
        from harness.kernels.checks.registry import OPS  # noqa: PLC0415  heavy: torchtitan, via the adapters; only some commands need it

        op = OPS[args.op]
        case = op.case(args.case) if args.case else _smallest_case(op)
        print(format_benchmark(benchmark(op, op.implementation(args.impl), args.device, case,
                                         getattr(torch, args.dtype), args.iters)))
        return 0

    if args.command == "list":
        print(list_implementations(args.run))
        return 0
    if args.command == "replay":
        result = do_replay(args.file)
        print(result.report())
        return 0 if result.passed else 1
    from harness.kernels.checks.calibrate import main as calibrate_main  # noqa: PLC0415  heavy: torchtitan, via the registry

    return calibrate_main(args.ops)

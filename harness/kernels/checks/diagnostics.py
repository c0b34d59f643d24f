"""Failure reports and replay files.

A failing ``RunResult`` prints, per failed check: worst index, actual/expected values, absolute
and relative error, how many elements mismatch, a histogram of |error| / bound, the
nki-library-style max-norm ratio and the float64 arbitration numbers. The inputs (float64
masters; the implementation's inputs are re-derived by rounding) are saved with
``torch.save`` under the given directory (a pytest ``tmp_path``), and the report ends with the
command that replays the case: ``python -m harness.kernels.checks replay <file>`` (the replay
itself is ``runner.replay``: data flows runner -> diagnostics, never back).
"""

from __future__ import annotations

from pathlib import Path

import torch

from harness.kernels.checks.spec import dtype_name

REPLAY_FORMAT = 1


def _fmt(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def format_check(check) -> list[str]:
    lines = [f"  {check.summary()}"]
    if check.passed:
        return lines
    d = check.details
    if "traceback" in d:
        lines += ["    " + line for line in d["traceback"].rstrip().splitlines()[-12:]]
    if "worst_index" in d:
        lines.append(
            f"    worst at {d['worst_index']}: actual {_fmt(d['actual'])}, expected {_fmt(d['expected'])}, "
            f"abs err {_fmt(d['abs_err'])}, rel err {_fmt(d['rel_err'])} ({_fmt(d['worst_in_tau'])} x bound)"
        )
        lines.append(
            f"    mismatched {d['mismatched']}/{d['total']}; max abs err {_fmt(d['max_abs_err'])}; "
            f"nki-library max-norm ratio max|a-b|/max|b| = {_fmt(d['nkilib_ratio'])}"
        )
        lines.append(f"    |err|/bound histogram: {d['histogram']}")
    if "arbitration" in d:
        a = d["arbitration"]
        lines.append(
            f"    float64 arbitration: max |a-truth| {_fmt(a['max_err'])} vs floor {_fmt(a['max_floor'])} "
            f"({_fmt(a['max_ratio'])}x); rms {_fmt(a['rms_err'])} vs {_fmt(a['rms_floor'])} ({_fmt(a['rms_ratio'])}x); "
            f"allowed {a['factor']:g}x"
        )
    if "invalid_tokens" in d:
        lines.append(f"    invalid tokens {d['invalid_tokens']}; worst margin {_fmt(d['worst_margin'])}")
    return lines


def format_report(result) -> str:
    lines = [result.title()]
    for check in result.checks:
        lines += format_check(check)
    if result.replay_path is not None:
        lines.append(f"  inputs saved: {result.replay_path}")
        lines.append(f"  replay: python -m harness.kernels.checks replay {result.replay_path}")
    return "\n".join(lines)


def save_replay(result, op, case, master: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{result.op}__{result.impl}__{result.device}__{result.case}__{dtype_name(result.dtype)}.pt"
    path = directory / name.replace("/", "_")
    torch.save(
        {
            "format": REPLAY_FORMAT,
            "op": result.op,
            "impl": result.impl,
            "device": result.device,
            "case": result.case,
            "dtype": dtype_name(result.dtype),
            "backward": result.backward,
            "seed": case.seed(op.name),
            "params": dict(case.params),
            "master_inputs": {k: v.clone() for k, v in master.items()},
            "report": format_report(result),
        },
        path,
    )
    return path

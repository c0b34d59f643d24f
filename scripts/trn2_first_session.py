"""The first trn2 session, prepared: run it as-is on a trn2 (no arguments needed).

    python3 scripts/trn2_first_session.py                 # trn2: the kernels at the 30B-A3B cut, LNC=2
    python3 scripts/trn2_first_session.py --stand-in      # rehearsal on CPU: the emulator on both sides
    python3 scripts/trn2_first_session.py --stand-in --runs  # and the runs on the cpu profile (the twin)

It runs the harness's RoPE kernel, our MoE forward and backward and nki-library's MoE forward at
the 30B-A3B cut on an LNC=2 NeuronCore, compares every output with the NKI emulator's on the same
inputs, records each kernel's first-call (compile) time, steady time and NEFF bytes, times our
MoE forward against nki-library's; then what the night's limits and its published-loss check
assume (``first_runs``): a tiny run's first step, cold (native Qwen3, 2 ranks: its wall time and
the NEFF bytes it compiled, against the night's 15 min for a tiny run), and the night's own
full-size pretrained C4 run of Qwen3-4B-Instruct-2507 for one step (its wall time, NEFF bytes,
step-1 loss) with the independent HF forward (float32, host CPU) of the same weights on that
step's batches, each held to the published 6.54 in its band: the published check is known to
be satisfiable before it gates a night. It writes ``report.json`` and ``report.md`` (default
``reports/trn2_first_session/<UTC time>/``). Exit status: 0 when every kernel ran and matched,
1 when any failed, 2 when there is no usable Neuron device (the reason is printed; --stand-in
rehearses the session on CPU). The logic is harness/kernels/checks/trn2_session.py.

The emulator side of the full cut takes several minutes of CPU (the MoE backward most).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

# Before torch loads (it autoloads torch_neuronx): LNC=2 for the runtime and the kernels, and a
# fresh NEFF cache so that every kernel's first call compiles and its NEFF bytes can be counted
# (Neuron 2.33: torch/reference/env-vars.html, compiler/about-compiler-artifacts.html). A cache
# directory set before is recorded in the report and left untouched.
ORIGINAL_NEFF_CACHE = os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR")
os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = tempfile.mkdtemp(prefix="trn2-session-neff-")
os.environ.setdefault("NEURON_LOGICAL_NC_CONFIG", "2")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.backends import BACKENDS  # noqa: E402
from harness.checks.reference_forward import hf_forward  # noqa: E402
from harness.device.devices import profile_for  # noqa: E402
from harness.kernels.checks import trn2_session  # noqa: E402
from harness.launch.run import launch  # noqa: E402
from harness.launch.run_matrix import RunCase  # noqa: E402
from harness.registry import environment  # noqa: E402
from harness.registry.assets_twin import build_twin  # noqa: E402
from harness.registry.expectations import ExpectationRegistry  # noqa: E402


def _neff_bytes(folder: str | None) -> int:
    return sum(f.stat().st_size for f in Path(folder).expanduser().rglob("*.neff")) if folder else 0


def _run(case, profile, out: Path, assets_root: str | None, c4_path: str | None) -> tuple:
    """``case``'s run as the night launches it (``RunCase.run_spec``), one step, cold: its
    result and the facts the night's limits assume."""
    spec = replace(case.run_spec(1, assets_root, workdir=str(out / "derived"), data_path=c4_path),
                   start="cold", label="first-session")
    cache = profile.compile_cache_dir
    before, started, first = _neff_bytes(cache), time.monotonic(), []
    result = launch(spec, profile, out / case.id, on_step=lambda s: first or first.append(time.monotonic()))
    return result, {"run": case.id, "ok": result.ok, "error": result.first_error(),
                    "first_step_s": round(first[0] - started, 1) if first else None,
                    "limit_s": case.timeout_s, "wall_s": round(result.duration_s, 1),
                    "neff_bytes": _neff_bytes(cache) - before, "compile_cache": result.compile_cache,
                    "step1_loss": result.losses[0] if result.steps else None}


def published_verdict(run_loss: float | None, forward: float | None, expectation) -> dict:
    """The published number against the run's step-1 loss and against the independent forward
    of the same weights on the same batches, each in the published band: the forward outside it
    means the published check cannot pass on this data, whatever the run does."""
    def held(value):
        return None if value is None else {"value": value, "deviation": expectation.deviation(value),
                                           "problem": expectation.check(value)}
    return {"published": expectation.value, "band": expectation.tolerance, "source": expectation.source,
            "run": held(run_loss), "forward": held(forward),
            "satisfiable": forward is not None and expectation.check(forward) is None}


def first_runs(out: Path, assets_root: str | None, c4_path: str | None) -> dict:
    profile = profile_for("neuron")  # trn2's, or its cpu stand-in (HARNESS_NEURON_STANDIN=cpu)
    default = BACKENDS["titan_native"].default_attention
    tiny = RunCase("neuron", "titan_native", "tiny", "pretrained", default)
    full = RunCase("neuron", "titan_native", "full", "pretrained", default)
    if full.twin:  # the cpu stand-in: the assets twin on fixtures/c4, as the rehearsed night
        assets_root, c4_path = str(build_twin(out / "assets_twin")), None
    report = {"profile": profile.describe(), "tiny": _run(tiny, profile, out, None, None)[1]}
    result, report["full"] = _run(full, profile, out, assets_root, c4_path)
    forward = source = None
    if result.steps:
        forward, source = hf_forward(result)
    report["full"]["independent_forward"] = {"value": forward, "source": source}
    expectation = ExpectationRegistry().published(result)
    report["full"]["published"] = None if expectation is None else published_verdict(
        report["full"]["step1_loss"], forward, expectation)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, help="where report.json / report.md go")
    parser.add_argument("--stand-in", action="store_true", help="no trn2: the emulator stands in for the device")
    parser.add_argument("--cut", choices=("source", "tiny"), help="source: the 30B-A3B cut (default on trn2); "
                        "tiny: a small cut (default with --stand-in)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls after the first (default 5)")
    parser.add_argument("--runs", action=argparse.BooleanOptionalAction, default=None,
                        help="the first runs (default: on trn2; with --stand-in only when asked: "
                        "the cpu profile runs them from the assets twin)")
    parser.add_argument("--assets-dir", default=os.environ.get("ASSETS_DIR") or str(Path.home() / "hf-assets"),
                        help="the night's assets root (default $ASSETS_DIR, else ~/hf-assets)")
    parser.add_argument("--c4-path", default=os.environ.get("C4_DIR") or str(Path.home() / "hf-data" / "c4"),
                        help="the night's local C4 copy (default $C4_DIR, else ~/hf-data/c4)")
    args = parser.parse_args(argv)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    output_dir = args.output_dir or ROOT / "reports" / "trn2_first_session" / stamp
    if args.stand_in:
        device = trn2_session.EmulatorDevice()
    else:
        device, reason = trn2_session.neuron_device_or_reason(Path(os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"]))
        if device is None:
            print(f"no usable Neuron device: {reason}\nRun this on a trn2 with the Neuron SDK's venv active, "
                  f"or rehearse on CPU with --stand-in.", file=sys.stderr)
            return 2
    cut_name = args.cut or ("tiny" if args.stand_in else "source")
    cut = trn2_session.TINY_CUT if cut_name == "tiny" else trn2_session.SOURCE_CUT
    report = trn2_session.run_session(device, cut, repeats=args.repeats)
    report["environment"]["TORCH_NEURONX_NEFF_CACHE_DIR before the session"] = ORIGINAL_NEFF_CACHE
    if args.runs if args.runs is not None else not args.stand_in:
        if args.stand_in:
            os.environ[environment.NEURON_STANDIN] = "cpu"
        report["runs"] = runs = first_runs(output_dir, args.assets_dir, args.c4_path)
        published = runs["full"]["published"]
        failures = [f"run {runs[k]['run']} failed: {runs[k]['error']}" for k in ("tiny", "full")
                    if not runs[k]["ok"]]
        if published is None:
            failures.append(f"no published number for {runs['full']['run']}")
        elif not published["satisfiable"]:
            failures.append("the independent forward misses the published number, so the night's "
                            f"published check cannot pass: {published['forward'] and published['forward']['problem']}")
        report["failures"] += failures
        report["status"] = "fail" if failures else report["status"]
    json_path, md_path = trn2_session.write_report(report, output_dir)
    print(trn2_session.markdown(report))
    print(f"report: {json_path} and {md_path}")
    return 0 if report["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())

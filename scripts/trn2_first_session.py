"""The first trn2 session, prepared: run it as-is on a trn2 (no arguments needed).

    python3 scripts/trn2_first_session.py                 # trn2: the kernels at the 30B-A3B cut, LNC=2
    python3 scripts/trn2_first_session.py --stand-in      # rehearsal on CPU: the emulator on both sides

It runs the harness's RoPE kernel, our MoE forward and backward and nki-library's MoE forward at
the 30B-A3B cut on an LNC=2 NeuronCore, compares every output with the NKI emulator's on the same
inputs, records each kernel's first-call (compile) time, steady time and NEFF bytes, times our
MoE forward against nki-library's, and writes ``report.json`` and ``report.md`` (default
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

from harness.kernels.checks import trn2_session  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, help="where report.json / report.md go")
    parser.add_argument("--stand-in", action="store_true", help="no trn2: the emulator stands in for the device")
    parser.add_argument("--cut", choices=("source", "tiny"), help="source: the 30B-A3B cut (default on trn2); "
                        "tiny: a small cut (default with --stand-in)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls after the first (default 5)")
    args = parser.parse_args(argv)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
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
    json_path, md_path = trn2_session.write_report(report, output_dir)
    print(trn2_session.markdown(report))
    print(f"report: {json_path} and {md_path}")
    return 0 if report["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())

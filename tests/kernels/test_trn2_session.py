"""The first trn2 session's report (harness/kernels/checks/trn2_session.py, scripts/trn2_first_session.py),
tested on CPU with the NKI emulator standing in for the device.

Specification:
- the script runs with no arguments and refuses clearly where there is no Neuron device (exit 2,
  the reason, and how to rehearse), and rehearses with ``--stand-in``;
- a session writes ``report.json`` and ``report.md``: every kernel (RoPE, MoE forward and
  backward, nki-library's MoE forward) with its status, first-call and steady times, NEFF bytes
  (none off the device), and per output the comparison with the emulator; the timing of our MoE
  forward against nki-library's; the environment; the failures;
- a device output that differs from the emulator's beyond the kernel tolerance, a kernel that
  raises, and a wrong output count are each reported as failures, and the script exits 1;
- the first runs (``--runs``; on CPU from the assets twin): a tiny run's first step and the full-size
  C4 run's, with the independent forward of its weights on its batches; the published check is
  satisfiable only when that forward meets the published number in its band.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from harness.registry import upstream

if upstream.missing("nki-library"):
    pytest.skip(upstream.missing("nki-library"), allow_module_level=True)

from harness.kernels.checks import trn2_session as session
from harness.registry import paths
from harness.registry.expectations import Expectation

MICRO_CUT = {"tokens": 4, "top_k": 2, "dim": 128, "hidden": 64, "experts": 2, "heads": 2, "head_dim": 128}
SCRIPT = paths.REPO_ROOT / "scripts" / "trn2_first_session.py"


class _Perturbed(session.EmulatorDevice):
    """A stand-in device whose ``name`` kernel returns its first output changed by ``delta`` at
    one element, or raises ``error``."""

    def __init__(self, name: str, delta: float = 0.0, error: Exception | None = None, drop_output: bool = False):
        super().__init__()
        self.target, self.delta, self.error, self.drop_output = name, delta, error, drop_output

    def call(self, name, args):
        results = super().call(name, args)
        if name != self.target:
            return results
        if self.error is not None:
            raise self.error
        if self.drop_output:
            return results[:-1]
        first = results[0].clone()
        first.view(-1)[0] += self.delta
        return (first, *results[1:])


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """One stand-in session at a micro cut, every kernel, written to disk."""
    report = session.run_session(session.EmulatorDevice(), MICRO_CUT, repeats=1)
    out = tmp_path_factory.mktemp("session")
    return report, session.write_report(report, out)


def report_structure_problems(report: dict) -> list[str]:
    problems = []
    for key in ("schema", "status", "started", "finished", "device", "cut", "routed_rows", "environment", "kernels",
                "timing", "failures"):
        if key not in report:
            problems.append(f"no {key!r}")
    names = [k["name"] for k in report.get("kernels", [])]
    if names != [k.name for k in session.KERNELS]:
        problems.append(f"kernels {names}")
    for kernel, spec in zip(report.get("kernels", []), session.KERNELS, strict=False):  # other names: above
        if kernel["status"] == "pass" and sorted(kernel["outputs"]) != sorted(spec.outputs):
            problems.append(f"{kernel['name']}: outputs {sorted(kernel['outputs'])}")
        if kernel["status"] == "pass" and not (kernel["first_call_s"] and kernel["steady_s"]):
            problems.append(f"{kernel['name']}: no times")
    if report.get("status") != ("pass" if not report.get("failures") else "fail"):
        problems.append(f"status {report.get('status')} with failures {report.get('failures')}")
    return problems


def test_a_rehearsal_writes_the_report_with_every_kernel_compared_and_timed(rehearsal):
    report, (json_path, md_path) = rehearsal
    assert report_structure_problems(report) == [] and report["status"] == "pass", report["failures"]
    assert json.loads(json_path.read_text())["kernels"] == json.loads(json.dumps(report["kernels"], default=str))
    assert report["device"] == {"name": "emulator (stand-in)", "stand_in": True, "lnc": 2}
    assert all(k["neff_bytes"] is None for k in report["kernels"])  # no NEFF off the device
    assert set(report["timing"]) == {"ours_moe_forward_s", "nkilib_moe_forward_s", "ours_over_nkilib"}
    text = md_path.read_text()
    for line in ("Status: **PASS**", "| moe_backward | pass |", "## MoE forward: ours against nki-library's",
                 "dx: ok", "the emulator's CPU time"):
        assert line in text, line


def test_the_structure_check_catches_a_report_missing_a_kernel(rehearsal):
    report = dict(rehearsal[0])
    report["kernels"] = report["kernels"][:-1]
    assert report_structure_problems(report)


@pytest.mark.parametrize("device,expected", [
    (_Perturbed("rope", delta=1.0), "rope: y 1 of"),
    (_Perturbed("rope", error=RuntimeError("NCC_EVRF066 LNC mismatch")), "rope: raised RuntimeError: NCC_EVRF066"),
    (_Perturbed("rope", drop_output=True), "rope: (count) 0 outputs, expected 1"),
], ids=["value", "raises", "output_count"])
def test_a_mismatch_with_the_emulator_is_reported_as_a_failure(device, expected, tmp_path):
    rope = [k for k in session.KERNELS if k.name == "rope"]
    report = session.run_session(device, MICRO_CUT, repeats=0, kernels=rope)
    assert report["status"] == "fail" and report["kernels"][0]["status"] == "fail"
    assert any(f.startswith(expected) for f in report["failures"]), report["failures"]
    _, md_path = session.write_report(report, tmp_path)
    assert "Status: **FAIL**" in md_path.read_text() and "## Failures" in md_path.read_text()


def test_one_bf16_ulp_on_one_element_is_within_the_tolerance(tmp_path):
    """The comparison is the kernel tolerance, not bit equality: a last-bit difference passes."""
    rope = [k for k in session.KERNELS if k.name == "rope"]
    x = session.rope_inputs(MICRO_CUT)[0]
    ulp = float(torch.finfo(torch.bfloat16).eps) * float(x.abs().max())
    report = session.run_session(_Perturbed("rope", delta=ulp / 4), MICRO_CUT, repeats=0, kernels=rope)
    assert report["status"] == "pass", report["failures"]


def _script(monkeypatch):
    """The script as a module; the environment it sets at import is restored after the test."""
    for name in ("TORCH_NEURONX_NEFF_CACHE_DIR", "NEURON_LOGICAL_NC_CONFIG"):
        # set, then removed: monkeypatch records the variable's state before the test (a delenv
        # of an unset variable records nothing, and what the script sets would stay for every
        # later test and launch of this process)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    spec = importlib.util.spec_from_file_location("trn2_first_session", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_without_a_neuron_device_says_why_and_how_to_rehearse(capsys, tmp_path, monkeypatch):
    script = _script(monkeypatch)
    try:
        assert script.main(["--output-dir", str(tmp_path)]) == 2
    finally:
        shutil.rmtree(os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"], ignore_errors=True)  # the script's fresh cache
    err = capsys.readouterr().err
    assert "no usable Neuron device" in err and "--stand-in" in err and not (tmp_path / "report.json").exists()


@pytest.mark.slow
def test_the_script_rehearses_on_cpu_and_exits_zero(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--stand-in", "--runs", "--repeats", "1", "--output-dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report_structure_problems(report) == []
    # the first runs on the cpu profile, from the assets twin: a tiny run's first step and the
    # full-size C4 run's, with the independent forward of its weights meeting the published stand-in
    runs = report["runs"]
    assert runs["tiny"]["ok"] and runs["tiny"]["first_step_s"] and runs["full"]["ok"], runs
    assert runs["full"]["independent_forward"]["value"] is not None and runs["full"]["published"]["satisfiable"], runs


def test_the_published_check_is_satisfiable_only_when_the_independent_forward_meets_it(monkeypatch):
    """The first session holds the published number to the independent forward of the same
    weights on the same batches: a forward outside the band means no run can pass the check."""
    script = _script(monkeypatch)
    published = Expectation(("titan_native", "qwen3_4b", "pretrained", "neuron", "c4"), 6.54, 0.05,
                            "published", "the source's published value")
    met = script.published_verdict(6.56, 6.53, published)
    assert met["satisfiable"] and met["run"]["problem"] is None and met["forward"]["problem"] is None
    # the broken inputs: a forward outside the band (the run inside it is no comfort), none at all
    missed = script.published_verdict(6.56, 6.70, published)
    assert not missed["satisfiable"] and "6.700000" in missed["forward"]["problem"]
    assert not script.published_verdict(6.56, None, published)["satisfiable"]
    # and a run outside the band is reported as such while the check stays satisfiable
    run_off = script.published_verdict(6.80, 6.53, published)
    assert run_off["satisfiable"] and run_off["run"]["problem"] is not None

"""``python -m harness run --baseline PATH`` end to end, on CPU (slow: three launches).

Specification: two clean reports of the same run compare equal (exit 0, nothing flagged, the
"vs baseline" column says "same"); a run with a planted defect (the q/k norms of layer 1
swapped) against the clean report is flagged with the run, the step and the module its
diagnosis names; the report's summary.md says both.
"""

import subprocess
import sys

import pytest

from harness.checks import run_checks as checks
from harness.device.devices import detect
from harness.launch.run import RunSpec, launch
from harness.registry import paths
from harness.report import baseline
from harness.report.run_report import RunVerdict, results_document, write_report

pytestmark = pytest.mark.slow
STEPS = 3


def harness_run(out, *extra):
    return subprocess.run([sys.executable, "-m", "harness", "run", "--backends", "titan_native",
                           "--steps", str(STEPS), "--output-dir", str(out), *extra],
                          cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def clean_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    done = harness_run(out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_two_clean_reports_flag_nothing(clean_report, tmp_path):
    done = harness_run(tmp_path, "--baseline", str(clean_report))
    assert done.returncode == 0, done.stdout[-3000:]
    summary = (tmp_path / "summary.md").read_text()
    assert "| vs baseline |" in summary and "nothing flagged" in summary, summary
    assert "| same |" in summary


def test_a_planted_defect_is_flagged_with_run_step_and_module(clean_report, tmp_path):
    spec = RunSpec(backend="titan_native", size="tiny", init="pretrained", steps=STEPS,
                   save_hf=True, plants=("qk_norm_swap_layer1",))
    run = launch(spec, detect("cpu"), tmp_path / "runs" / "planted")
    verdicts = [RunVerdict(run, checks.verdicts(run, STEPS))]
    before = baseline.load(clean_report)
    compared = baseline.compare(results_document(verdicts, before["header"]), before)
    (flagged,) = compared.flagged
    assert flagged.name == "titan_native-tiny-pretrained+plant:qk_norm_swap_layer1"
    assert (flagged.flags[0].what, flagged.flags[0].step) == ("step-1 loss", 1)
    assert flagged.module == "layers.1.attention.q_norm"
    write_report(verdicts, tmp_path, before["header"], compared, before)
    summary = (tmp_path / "summary.md").read_text()
    assert "first divergent module layers.1.attention.q_norm" in summary, summary

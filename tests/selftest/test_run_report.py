"""The session's run report (``--run-report``) says what the tests said (harness/report/
pytest_plugin.py, harness/checks/run_checks.py ``record``).

Specification:
- every check a test enforces records its verdict beside the run; the report is written from
  those verdicts, never judged again after the session (whose clean-up removed the full-size
  checkpoints: judged again, the checkpoint check would read "no HF checkpoint");
- a full-size run's checkpoints go as soon as every check that reads them has recorded its
  verdict, whatever order the checks run in; a tiny run's stay (other checks read them);
- a check the session did not select has no verdict: the report says the run was not checked.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

from harness.checks import run_checks as checks
from harness.launch.run import RunSpec
from harness.registry import dump_layout, paths
from harness.report.pytest_plugin import write_session_report
from harness.results.run_result import RunResult, StepRecord


def _run(tmp_path, size: str) -> RunResult:
    run_dir = tmp_path / f"{size}-run"
    checkpoint = dump_layout.checkpoint_dir(run_dir, 2)
    checkpoint.mkdir(parents=True)
    shutil.copy(paths.TINY_DENSE / "model.safetensors", checkpoint / "model.safetensors")
    steps = [StepRecord(i, 1.3, 1.0, 1000.0, 0.2, 0.9) for i in (1, 2)]
    spec = RunSpec("titan_native", size=size, init="pretrained", steps=2,
                   hf_assets_path=str(paths.TINY_DENSE) if size == "full" else None)
    return RunResult(spec=spec, device="cpu", nproc=2, layout="fsdp", degrees=spec.parallel_degrees(2),
                     command=["torchrun", "--training.steps", "2"], returncode=0, timed_out=False,
                     duration_s=1.0, run_dir=run_dir, steps=steps)


def _enforced(check: str, run: RunResult):
    result, outcome = checks.verdict(check, run, 2)
    checks.record(check, run, result, outcome)
    return result


def test_the_report_holds_the_verdicts_the_tests_recorded_after_the_checkpoints_are_gone(tmp_path):
    run = _run(tmp_path, "full")
    assert _enforced("hf_checkpoint_complete", run).status == "pass"
    assert not dump_layout.checkpoints(run.run_dir).exists(), "its one reader is done"
    out = write_session_report([run], tmp_path / "report", steps=2)
    document = json.loads((out / "results.json").read_text())
    assert document["runs"][0]["checks"]["hf_checkpoint_complete"]["status"] == "pass"
    judged_again = checks.verdicts(run, 2, ["hf_checkpoint_complete"])["hf_checkpoint_complete"][0]
    assert judged_again.status == "fail" and "no HF checkpoint" in judged_again.message, (
        "what a report judged again after the clean-up would say")


def test_a_tiny_run_keeps_its_checkpoints_and_an_unchecked_run_is_said_to_be(tmp_path):
    run = _run(tmp_path, "tiny")
    _enforced("hf_checkpoint_complete", replace(run))
    assert dump_layout.checkpoints(run.run_dir).is_dir()
    other = _run(tmp_path / "other", "full")
    unchecked = replace(other, spec=replace(other.spec, init="random"))
    out = write_session_report([unchecked], tmp_path / "report", steps=2)
    assert "| not checked in this session |" in (out / "summary.md").read_text()

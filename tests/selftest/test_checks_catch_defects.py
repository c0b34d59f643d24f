"""The e2e checks fail on broken runs (fabricated results; no launch needed)."""

from pathlib import Path

import pytest

from harness import checks
from harness.expectations import ExpectationRegistry, MissingExpectation
from harness.results import RunResult, StepRecord


def _run(losses, returncode=0, timed_out=False) -> RunResult:
    steps = [StepRecord(step=i + 1, loss=loss, grad_norm=1.0, tokens_per_s=1.0,
                        step_time_s=1.0, peak_memory_gib=1.0) for i, loss in enumerate(losses)]
    return RunResult(name="planted", backend="titan_native", size="tiny", init="pretrained",
                     device="cpu", nproc=2, command=["torchrun"], returncode=returncode,
                     timed_out=timed_out, duration_s=1.0, run_dir=Path("/nonexistent"), steps=steps)


@pytest.fixture
def pretrained_expectation():
    return ExpectationRegistry().get("titan_native", "tiny_dense", "pretrained", "cpu")


def test_a_healthy_run_passes(pretrained_expectation):
    run = _run([pretrained_expectation.value, 1.0, 0.9])
    assert checks.run_completed(run, 3) == []
    assert checks.losses_finite(run) == []
    assert checks.first_step_loss(run, pretrained_expectation) == []


def test_catches_a_missing_step():
    assert checks.run_completed(_run([1.0, 1.0]), 3) == ["logged steps [1, 2], expected 1..3"]


def test_catches_a_crash_and_a_timeout():
    assert "exited with code 1" in checks.run_completed(_run([1.0], returncode=1), 1)[0]
    assert "timed out" in checks.run_completed(_run([1.0], timed_out=True), 1)[0]


def test_catches_every_nonfinite_loss():
    problems = checks.losses_finite(_run([1.0, float("nan"), float("inf")]))
    assert problems == ["step 2: loss nan", "step 3: loss inf"]


def test_catches_a_first_step_loss_just_outside_tolerance(pretrained_expectation):
    off = pretrained_expectation.value + 2 * pretrained_expectation.tolerance
    problems = checks.first_step_loss(_run([off]), pretrained_expectation)
    assert len(problems) == 1 and "recorded_fp32" in problems[0]


def test_catches_a_nan_first_step(pretrained_expectation):
    assert checks.first_step_loss(_run([float("nan")]), pretrained_expectation)


def test_missing_expectation_names_the_key():
    with pytest.raises(MissingExpectation, match="backend='hf_v5' model='tiny_moe'"):
        ExpectationRegistry().get("hf_v5", "tiny_moe", "random", "cpu")


def test_device_specific_expectation_is_not_used_elsewhere():
    with pytest.raises(MissingExpectation):
        ExpectationRegistry().get("titan_native", "Qwen3-4B-Instruct-2507", "random", "cpu")

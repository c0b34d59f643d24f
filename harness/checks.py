"""Checks on one run's results. Each returns every violation it finds (empty = pass)."""

from __future__ import annotations

import math

from harness.expectations import Expectation
from harness.results import RunResult


def run_completed(run: RunResult, steps: int) -> list[str]:
    problems = []
    if run.timed_out:
        problems.append("the run timed out and was killed")
    elif run.returncode != 0:
        problems.append(f"the launcher exited with code {run.returncode}")
    logged = [s.step for s in run.steps]
    if logged != list(range(1, steps + 1)):
        problems.append(f"logged steps {logged}, expected 1..{steps}")
    return problems


def losses_finite(run: RunResult) -> list[str]:
    if not run.steps:
        return ["no step was logged"]
    return [f"step {s.step}: loss {s.loss}" for s in run.steps if not math.isfinite(s.loss)]


def first_step_loss(run: RunResult, expectation: Expectation) -> list[str]:
    if not run.steps:
        return ["no step was logged"]
    problem = expectation.check(run.steps[0].loss)
    return [problem] if problem else []


def report(problems: list[str], run: RunResult) -> str:
    listed = "\n".join(f"  - {p}" for p in problems)
    return f"{len(problems)} violation(s):\n{listed}\n{run.describe()}"

"""Tonight against last night, per run of the run template (``pytest --baseline PATH``).

Specification: with ``--baseline`` (a previous report folder or its results.json), every
launched run equals the same run of the baseline: step-1 loss and the loss and grad-norm
curves exactly, compile time, step time and peak memory within their ratio thresholds
(harness/report/baseline.py, harness/registry/tolerances.py). A numeric change with the same commit
and package versions is named as such. Without ``--baseline`` these tests are deselected.
"""

from harness.checks import run_checks as checks
from harness.report import baseline
from harness.report.pytest_plugin import header
from harness.report.run_report import RunVerdict, results_document


def test_vs_baseline(launched_run, baseline_document):
    # The verdicts the run's tests recorded (the first divergent module of a diagnosed failure
    # is named beside the flags); never judged again here.
    tonight = results_document([RunVerdict(launched_run, checks.recorded(launched_run))], header())
    compared = baseline.compare(tonight, {**baseline_document, "runs": [
        r for r in baseline_document["runs"]
        if baseline.run_key(r["name"]) == baseline.run_key(launched_run.spec.name)]})
    assert compared.ok, "\n".join(compared.lines())

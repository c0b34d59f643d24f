#!/usr/bin/env bash
# Nightly step "Use the previous night's report (the baseline)": the run report of the last
# successful night (artifact reports-trn2, downloaded by actions/download-artifact into
# $RUNNER_TEMP/baseline, the run found by scripts/nightly/baseline_run.py) becomes tonight's
# --baseline (harness/report/baseline.py). None there: no baseline, never a failure.
#
# Env: RUNNER_TEMP, GITHUB_ENV (the runner's).
set -uo pipefail
dir="${RUNNER_TEMP:-/tmp}/baseline"
if [[ -f "$dir/run-report/results.json" ]]; then
    echo "baseline: $dir/run-report"
    echo "BASELINE_ARGS=--baseline=$dir/run-report" >> "${GITHUB_ENV:-/dev/stdout}"
else
    echo "::notice::no previous successful night with a run report: no baseline tonight"
    echo "BASELINE_ARGS=" >> "${GITHUB_ENV:-/dev/stdout}"
fi

#!/usr/bin/env bash
# Nightly step "Fetch the previous night's report (the baseline)": the run report of the last
# successful night (artifact reports-trn2, folder run-report/) becomes tonight's --baseline
# (harness/report/baseline.py). No previous night, or no gh: no baseline, never a failure.
#
# Env: GH_TOKEN, GITHUB_REPOSITORY, RUNNER_TEMP, GITHUB_ENV (the runner's).
set -uo pipefail
dir="${RUNNER_TEMP:-/tmp}/baseline"
rm -rf "$dir"
previous=""
if command -v gh >/dev/null; then
    previous=$(gh run list --repo "$GITHUB_REPOSITORY" --workflow nightly-trn2.yml \
        --status success --limit 1 --json databaseId --jq '.[0].databaseId // empty' || true)
else
    echo "::warning::gh is not installed on the runner: no baseline tonight"
fi
if [[ -n "$previous" ]] && gh run download "$previous" --repo "$GITHUB_REPOSITORY" \
        --name reports-trn2 --dir "$dir" && [[ -f "$dir/run-report/results.json" ]]; then
    echo "baseline: night run $previous ($dir/run-report)"
    echo "BASELINE_ARGS=--baseline=$dir/run-report" >> "${GITHUB_ENV:-/dev/stdout}"
else
    echo "::notice::no previous successful night with a run report: no baseline tonight"
    echo "BASELINE_ARGS=" >> "${GITHUB_ENV:-/dev/stdout}"
fi

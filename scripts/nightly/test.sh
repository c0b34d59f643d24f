#!/usr/bin/env bash
# Nightly step "Test (neuron tier)": `pytest -m neuron` as a trn2 runner runs it; its exit code
# becomes the step output exit-code (the summary step reads it).
#
# Env: ASSETS_DIR (the HF assets root), C4_DIR (the local C4 copy, scripts/nightly/fetch_data.py),
# EXTRA_PYTEST_ARGS (workflow_dispatch input), BASELINE_ARGS (scripts/nightly/fetch_baseline.sh),
# GITHUB_OUTPUT (the runner's).
set +e
mkdir -p reports
# Every option takes its value after "=": pytest finds its rootdir (and so conftest.py, which
# defines these options) before it knows them, and a separate value that is an existing folder
# (/opt/hf-assets) would count as a test path and move the rootdir out of the checkout.
# shellcheck disable=SC2086  # EXTRA_PYTEST_ARGS, BASELINE_ARGS: lists of arguments
python3 -m pytest -m neuron --trn2-runner --assets-dir="$ASSETS_DIR" --c4-path="$C4_DIR" \
    --basetemp=reports/tmp --junitxml=reports/junit.xml -ra ${EXTRA_PYTEST_ARGS:-} \
    --run-report=reports/run-report ${BASELINE_ARGS:-} \
    2>&1 | tee reports/pytest.log
code=${PIPESTATUS[0]}
echo "exit-code=$code" >> "${GITHUB_OUTPUT:-/dev/stdout}"
exit "$code"

#!/usr/bin/env bash
# Nightly step "Install the harness": into the runner user's own venv (HARNESS_VENV, made once by
# scripts/nightly/provision.py over the image's venv, with TorchTitan Neuron in it; first on PATH
# by image_env.sh), pip may add what the harness needs but never replace the image's stack
# (constraints/neuron_image.py pins every installed torch / torch-neuronx / torchvision / nki /
# neuronx-cc / torchtitan, and refuses a torchtitan that is not TorchTitan Neuron), then the
# neuron tier must be usable (harness.device.devices.tier_status). Nothing here needs root.
set -euo pipefail
mkdir -p reports
venv="${HARNESS_VENV:-$HOME/.venvs/titan-night}"
prefix="$(python3 -c 'import sys; print(sys.prefix)')"
if [[ "$(cd "$prefix" && pwd -P)" != "$(cd "$venv" 2>/dev/null && pwd -P)" ]]; then
    echo "::error::python3 is $prefix, not the runner's venv $venv: provision the runner once, as" \
         "its user: python3 scripts/nightly/provision.py --fork <a clone of" \
         "https://github.com/aws-neuron/torchtitan-neuron> (docs/nightly.md#provisioning-the-runner)"
    exit 1
fi
python3 constraints/neuron_image.py > reports/image-constraints.txt
echo "Constraints from the image:"; cat reports/image-constraints.txt
python3 -m pip install --disable-pip-version-check -e . -c reports/image-constraints.txt
python3 - <<'PY'
from harness.device.devices import tier_status
from harness.upstream.titan_api import TORCHTITAN_VERSION, generation

print(f"torchtitan {TORCHTITAN_VERSION}: API generation {generation()}")
available, reason = tier_status("neuron")
print(f"neuron tier: {reason}")
if not available:
    print(f"::error::the Neuron device is not usable after installing the harness: {reason}")
    raise SystemExit(1)
PY

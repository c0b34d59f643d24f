#!/usr/bin/env bash
# Nightly step "Install the harness": pip may add what the harness needs but never replace the
# image's stack (constraints/neuron_image.py pins every installed torch / torch-neuronx /
# torchvision / nki / neuronx-cc / torchtitan, and refuses a torchtitan that is not TorchTitan
# Neuron), then the neuron tier must be usable (harness.device.devices.tier_status).
set -euo pipefail
mkdir -p reports
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

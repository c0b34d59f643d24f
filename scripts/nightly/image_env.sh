#!/usr/bin/env bash
# Nightly step "Use the image's Neuron environment": find the image's PyTorch/Neuron venv and put
# it first on PATH for every later step; export the compile-cache folder the device profile uses.
#
# The Neuron DLAMI keeps its PyTorch stack in a venv under /opt, not on PATH. Neuron SDK 2.33's
# "Deep Learning AMI Neuron torch-neuronx 2.14.0" names it /opt/aws_neuronx_venv_torch_neuronx_2_14_0
# (Neuron 2.33 docs, setup/pytorch/update-dlami); DLAMIs up to SDK 2.31 named theirs
# /opt/aws_neuronx_venv_pytorch_*. The newest of the first kind wins, then the newest of the
# second; TRN2_NEURON_VENV (repository variable -> NEURON_VENV) names one explicitly. The Neuron
# container has no venv: its python3 already imports torch_neuronx, which is checked instead.
#
# The night itself runs in the runner user's own venv over the image's (HARNESS_VENV, default
# $HOME/.venvs/titan-night: TorchTitan Neuron and the harness; scripts/nightly/provision.py
# makes it once): the image's venv is root's, and nothing of the night may need root. It comes
# first on PATH when it exists (install.sh refuses to go on without it).
#
# Every folder the night writes defaults to the runner user's home; the repository variables
# move them (TRN2_ASSETS_DIR, TRN2_C4_DIR, TRN2_HARNESS_VENV). The defaults are exported here,
# the one place later steps read them from (scripts/nightly/preflight.py states the same).
#
# Env: NEURON_VENV (explicit venv), NEURON_OPT_ROOT (where the image keeps its venvs and tools;
# default /opt), ASSETS_DIR, C4_DIR, HARNESS_VENV, GITHUB_PATH / GITHUB_ENV (the runner's;
# unset: printed only).
set -euo pipefail
root="${NEURON_OPT_ROOT:-/opt}"
GLOBS=("aws_neuronx_venv_torch_neuronx_*" "aws_neuronx_venv_pytorch_*")

newest() {  # the newest folder under $root matching $1 (version order), or nothing
    [[ -d "$root" ]] || return 0
    find "$root" -maxdepth 1 -type d -name "$1" | sort -V | tail -n 1
}

venv="${NEURON_VENV:-}"
if [[ -z "$venv" ]]; then
    for glob in "${GLOBS[@]}"; do
        venv="$(newest "$glob")"
        [[ -n "$venv" ]] && break
    done
fi
if [[ -n "$venv" ]]; then
    if [[ ! -x "$venv/bin/python3" ]]; then
        echo "::error::the Neuron venv $venv has no bin/python3 (TRN2_NEURON_VENV, or $root/${GLOBS[0]})"
        exit 1
    fi
    echo "Neuron venv: $venv"
    bin="$venv/bin"
elif python3 -c "import torch_neuronx" >/dev/null 2>&1; then
    echo "no Neuron venv under $root: python3 ($(command -v python3)) imports torch_neuronx (the Neuron container)"
    bin=""
else
    echo "::error::no Neuron venv under $root (looked for ${GLOBS[*]}) and python3 on PATH does not import" \
         "torch_neuronx: on a Neuron 2.33 DLAMI the venv is $root/aws_neuronx_venv_torch_neuronx_2_14_0;" \
         "set the repository variable TRN2_NEURON_VENV to the venv the image has"
    exit 1
fi

cache="$HOME/.cache/neuron-neff"
harness_venv="${HARNESS_VENV:-$HOME/.venvs/titan-night}"
if [[ -z "${PREFLIGHT:-}" ]]; then
    mkdir -p reports "$cache"
fi
{   # GitHub puts each line first on PATH in turn: the last line wins
    [[ -d "$root/aws/neuron/bin" ]] && echo "$root/aws/neuron/bin"
    [[ -n "$bin" ]] && echo "$bin"
    [[ -x "$harness_venv/bin/python3" ]] && echo "$harness_venv/bin"
    true
} >> "${GITHUB_PATH:-/dev/stdout}"
{
    # The harness's device profile passes this to every rank (harness/device/devices.py NEFF_CACHE_ENV).
    echo "TORCH_NEURONX_NEFF_CACHE_DIR=$cache"
    # torch-neuronx's second, local NEFF cache (lock files); the runner's own, not a shared /tmp folder
    echo "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR=$HOME/.cache/neuron-neff-local"
    echo "NEURON_VENV=$venv"
    echo "HARNESS_VENV=$harness_venv"
    echo "ASSETS_DIR=${ASSETS_DIR:-$HOME/hf-assets}"
    echo "C4_DIR=${C4_DIR:-$HOME/hf-data/c4}"
} >> "${GITHUB_ENV:-/dev/stdout}"

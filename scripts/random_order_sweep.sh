#!/usr/bin/env bash
# The default suite in a random order, once per seed (pytest-random-order, pinned in
# constraints/cpu.txt): a test that passes only after another, state one test leaves for the
# next (a monkeypatch not undone, a registry entry left behind, a session fixture torn down and
# set up again between its readers) fails here and not in the usual order.
#
# Usage: scripts/random_order_sweep.sh [SEED...]      (default seeds: 1 2)
# Env: PYTHON (default python3; e.g. .venv-titan-spring2026/bin/python for spring2026),
#      BUCKET (default global: every test shuffled across modules; module, package, ...).
# Each run prints its seed; the same command with that seed repeats its order exactly (xdist's
# workers take the controller's seed). Exit status: 0 when every seed passed, else 1.
# The default command (`python3 -m pytest`) never shuffles: the plugin is off unless asked for.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
bucket="${BUCKET:-global}"
seeds=("$@")
[[ ${#seeds[@]} -eq 0 ]] && seeds=(1 2)
failed=()
for seed in "${seeds[@]}"; do
    command=("$python" -m pytest -p no:cacheprovider "--random-order-bucket=$bucket" "--random-order-seed=$seed")
    echo "random-order sweep: seed $seed: ${command[*]}"
    "${command[@]}" || failed+=("$seed")
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "random-order sweep: FAILED with seeds ${failed[*]} (bucket $bucket)"
    exit 1
fi
echo "random-order sweep: passed with seeds ${seeds[*]} (bucket $bucket)"

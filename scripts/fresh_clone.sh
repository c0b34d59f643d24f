#!/usr/bin/env bash
# The README's two set-up commands, exactly as a new user runs them: a fresh clone of this
# repository in an empty folder (nothing beside it), a fresh virtual environment (no system
# site-packages: nothing installed by hand shows through), then each command of the README's
# first bash block in turn. Fails on the first command that fails; prints each one's wall time.
#
# Usage: scripts/fresh_clone.sh [WORKDIR]     (default: a new temporary folder, removed after)
# Env: PYTHON (default python3): the interpreter the venv is made from.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-}"
if [[ -z "$work" ]]; then
    work="$(mktemp -d -t fresh-clone-XXXXXX)"
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/empty"
clone="$work/empty/titan-parity-harness"
rm -rf "$clone" "$work/venv"
git clone --quiet "$repo" "$clone"
# The commands: the lines of README.md's first ```bash block (comments after '#' kept: bash ignores them).
mapfile -t commands < <(awk '/^```bash$/ {inside=1; next} inside && /^```$/ {exit} inside && NF {print}' "$clone/README.md")
if [[ ${#commands[@]} -ne 2 ]]; then
    echo "fresh_clone: README.md's first bash block has ${#commands[@]} commands, not the two set-up commands" >&2
    exit 1
fi
beside="$(ls -A "$work/empty")"
if [[ "$beside" != "titan-parity-harness" ]]; then
    echo "fresh_clone: $work/empty holds more than the clone ($beside): it must have nothing beside it" >&2
    exit 1
fi
"${PYTHON:-python3}" -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
cd "$clone"
for command in "${commands[@]}"; do
    echo "fresh_clone: \$ $command"
    start=$SECONDS
    status=0
    bash -c "set -o pipefail; $command" || status=$?
    echo "fresh_clone: exit $status after $((SECONDS - start)) s"
    if [[ $status -ne 0 ]]; then
        exit "$status"
    fi
done

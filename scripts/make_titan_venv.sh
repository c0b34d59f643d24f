#!/usr/bin/env bash
# Build (or reuse) the spring-2026 torchtitan environment: .venv-titan-spring2026/.
#
# The harness runs against two torchtitan API generations (harness/upstream/titan_api/): PyPI's 0.3.0
# in the system environment, and torchtitan `main` of spring 2026 (what TorchTitan Neuron
# 0.2.2+neuron.1 forks), pinned in constraints/upstream.toml [torchtitan-spring2026]. Normally
# run by `python3 scripts/get_upstream.py torchtitan-spring2026`, which fetches the wheel (built
# from its source commit, or from a mirror, checked either way) into build/upstream/wheels. This venv
# sees the system site-packages (torch, transformers, everything else: nothing large is
# downloaded again) and installs only the wheel and the requirements it pins to a version
# the system does not have (spmd_types==0.2.1), both with --no-deps.
#
# Usage: scripts/make_titan_venv.sh           # prints the venv's python on its last line
# Exit status: 0 built or reused; 2 skipped (no wheel dir / no wheel: nothing to test with);
# anything else: a real failure.
# Env: TITAN_WHEEL_DIR (default: <repo>/build/upstream/wheels), TITAN_VENV (default:
# <repo>/.venv-titan-spring2026).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
wheel_dir="${TITAN_WHEEL_DIR:-$repo/build/upstream/wheels}"
venv="${TITAN_VENV:-$repo/.venv-titan-spring2026}"
# The requirements of the wheel that the system environment does not satisfy (the wheel pins
# spmd_types==0.2.1; torchtitan 0.3.0 brings 0.2.3). Checked below against the wheel's metadata.
extra_pins=("spmd_types==0.2.1")

if [[ ! -d "$wheel_dir" ]]; then
    echo "make_titan_venv: SKIP: no wheel directory $wheel_dir (it holds torchtitan's spring-2026" \
         "main wheel: python3 scripts/get_upstream.py torchtitan-spring2026 fetches it and builds this venv)" >&2
    exit 2
fi
shopt -s nullglob
wheels=("$wheel_dir"/torchtitan-0.2.2+*-py3-none-any.whl)
shopt -u nullglob
if [[ ${#wheels[@]} -eq 0 ]]; then
    echo "make_titan_venv: SKIP: no torchtitan-0.2.2+*-py3-none-any.whl in $wheel_dir" >&2
    exit 2
fi
if [[ ${#wheels[@]} -gt 1 ]]; then
    echo "make_titan_venv: more than one torchtitan wheel in $wheel_dir: ${wheels[*]};" \
         "keep one, or point TITAN_WHEEL_DIR at a directory with one" >&2
    exit 1
fi
wheel="${wheels[0]}"
# torchtitan-0.2.2+main.a9c5edc74-py3-none-any.whl -> 0.2.2+main.a9c5edc74
want="$(basename "$wheel")"; want="${want#torchtitan-}"; want="${want%-py3-none-any.whl}"

installed_version() {  # torchtitan's version as the venv sees it, only if installed in the venv
    "$venv/bin/python" - "$venv" <<'EOF' 2>/dev/null || true
import sys, importlib.metadata as md, pathlib
dist = md.distribution("torchtitan")
where = pathlib.Path(dist.locate_file("")).resolve()
if str(where).startswith(str(pathlib.Path(sys.argv[1]).resolve())):
    print(dist.version)
EOF
}

if [[ -x "$venv/bin/python" && "$(installed_version)" == "$want" ]]; then
    echo "make_titan_venv: reusing $venv (torchtitan $want)" >&2
else
    echo "make_titan_venv: building $venv with torchtitan $want from $wheel" >&2
    if [[ -e "$venv" && ! -f "$venv/pyvenv.cfg" ]]; then
        echo "make_titan_venv: $venv exists and is not a virtual environment; move it away" >&2
        exit 1
    fi
    rm -rf "$venv"
    python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        "$wheel" "${extra_pins[@]}"
fi

# Every requirement of the wheel must be satisfied (by the venv or the system), or the venv
# is not the environment the wheel declares: name what is missing and how to fix it.
"$venv/bin/python" - "$want" <<'EOF'
import sys
import importlib.metadata as md
from packaging.requirements import Requirement

want = sys.argv[1]
have = md.version("torchtitan")
if have != want:
    sys.exit(f"make_titan_venv: the venv has torchtitan {have}, not {want}; delete the venv and rerun")
bad = []
for text in md.requires("torchtitan") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # extras (dev)
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        bad.append(f"{req} (not installed)")
        continue
    if not req.specifier.contains(version, prereleases=True):
        bad.append(f"{req} (installed: {version})")
if bad:
    sys.exit("make_titan_venv: requirements of torchtitan " + want + " not satisfied: "
             + "; ".join(bad) + ". Add the exact pins to extra_pins in scripts/make_titan_venv.sh "
             "(or install them into the system environment), then rerun.")
EOF
echo "$venv/bin/python"

#!/usr/bin/env python3
"""Provision a trn2 runner once, as the runner user (no root): the night's own venv with
TorchTitan Neuron in it.

    python3 scripts/nightly/provision.py --fork ~/torchtitan-neuron        # a clone (editable install)
    python3 scripts/nightly/provision.py --fork torchtitan-0.2.2+neuron.1-py3-none-any.whl

The Neuron DLAMI keeps torch-neuronx, nki and neuronx-cc in a venv under /opt that root owns,
and does not ship TorchTitan Neuron (its docs: clone aws-neuron/torchtitan-neuron and install it
editable, training/torchtitan/get-started/setup-torchtitan-neuron). The GitHub runner
does not run as root, so the night cannot install into that venv. This makes the runner's own
venv (``$HARNESS_VENV``, default ``$HOME/.venvs/titan-night``) over the image's: created from
the image venv's python, it sees the image venv's site-packages through a ``.pth`` file (after
its own, so what is installed here wins), and TorchTitan Neuron is installed into it. The
nightly then runs in it (scripts/nightly/image_env.sh puts it first on PATH; install.sh adds the
harness to it, pinned to the image's stack). Run it again to move to another fork release.

``--no-deps`` installs the fork alone (an offline runner whose image already holds its
requirements); otherwise pip also fetches its requirements from PyPI, as the docs do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

NIGHTLY = Path(__file__).resolve().parent


def image_python() -> str:
    """The image venv's python, found as the night finds it (image_env.sh), or this one."""
    with tempfile.TemporaryDirectory() as scratch:
        files = {k: Path(scratch) / k for k in ("GITHUB_PATH", "GITHUB_ENV")}
        for f in files.values():
            f.touch()
        env = {**os.environ, **{k: str(v) for k, v in files.items()}, "PREFLIGHT": "1",
               "HARNESS_VENV": "/nonexistent"}  # the image's own venv, not the one being made
        done = subprocess.run(["bash", str(NIGHTLY / "image_env.sh")], env=env, cwd=scratch,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"provision: no Neuron image venv: {done.stdout}{done.stderr}")
        lines = files["GITHUB_PATH"].read_text().split()
    venv_bin = next((line for line in reversed(lines) if (Path(line) / "python3").exists()), None)
    return str(Path(venv_bin) / "python3") if venv_bin else sys.executable


def run(*command: str) -> str:
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"provision: failed (exit {done.returncode}): {' '.join(command)}\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fork", required=True, help="a clone of aws-neuron/torchtitan-neuron, or its wheel")
    parser.add_argument("--venv", default=os.environ.get("HARNESS_VENV")
                        or os.path.expanduser("~/.venvs/titan-night"))
    parser.add_argument("--image-python", default=None, help="the image venv's python (default: "
                        "found as scripts/nightly/image_env.sh finds it)")
    parser.add_argument("--no-deps", action="store_true")
    args = parser.parse_args(argv)
    if os.getuid() == 0:
        raise SystemExit("provision: run this as the runner user, not root (the night runs as that "
                         "user and must own its venv)")
    base = args.image_python or image_python()
    venv = Path(args.venv)
    if not (venv / "bin" / "python3").exists():
        run(base, "-m", "venv", "--system-site-packages", str(venv))
    python = str(venv / "bin" / "python3")
    image_sites = json.loads(run(base, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"))
    own_site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    (Path(own_site) / "neuron-image.pth").write_text("".join(f"{s}\n" for s in image_sites))
    fork = Path(args.fork)
    target = ["-e", str(fork)] if fork.is_dir() else [str(fork)]
    run(python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
        *(["--no-deps"] if args.no_deps else []), *target)
    version = run(python, "-c", "from importlib import metadata; print(metadata.version('torchtitan'))").strip()
    if "+neuron" not in version:
        raise SystemExit(f"provision: {venv} has torchtitan {version}, not a TorchTitan Neuron build")
    print(f"provisioned {venv}: torchtitan {version} over the image's venv ({base})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

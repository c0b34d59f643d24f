#!/usr/bin/env python3
"""Install the upstreams the harness pins beyond PyPI (constraints/upstream.toml).

    python3 scripts/get_upstream.py                       # every pin, from its real source (git)
    python3 scripts/get_upstream.py nki-library           # one or more by name
    python3 scripts/get_upstream.py --mirror DIR ...      # from an offline mirror of the artifacts
    python3 scripts/get_upstream.py --list                # the pins and whether each is installed

The same commit is checked either way: from the real source, a clone checked out at the pin's
commit (``git rev-parse HEAD``) builds the artifact (a wheel with ``pip wheel --no-deps``, its
version checked against the pin's; the test tarballs with ``git archive``); from a mirror, the
artifact must have the pin's sha256 (the artifact built from that commit, unchanged). Then, by
kind: a wheel is installed into this python with ``--no-deps`` (nki-library declares the PyPI
placeholders of nki and neuronx-cc); the spring-2026 torchtitan gets its own venv
(scripts/make_titan_venv.sh); a test tarball is left under build/upstream/ for
scripts/nkilib_tests.py. Exit status: 0 done; 1 a check failed (nothing installed from it).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.registry.upstream import UPSTREAM_DIR, Pin, pins  # noqa: E402

SOURCES = UPSTREAM_DIR / "src"


class UpstreamError(RuntimeError):
    pass


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def from_mirror(pin: Pin, mirror: Path) -> Path:
    source = mirror / pin.mirror_dir / pin.artifact
    if not source.is_file():
        raise UpstreamError(f"{pin.name}: {source} is not in the mirror (expected {pin.artifact} "
                            f"built from {pin.repo} at {pin.commit})")
    digest = sha256(source)
    if digest != pin.sha256:
        raise UpstreamError(f"{pin.name}: {source} has sha256 {digest}, the pin's is {pin.sha256} "
                            f"(the artifact of {pin.repo} at {pin.commit}): a different build")
    pin.fetched.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, pin.fetched)
    return pin.fetched


def checkout(pin: Pin) -> Path:
    """A clone of the pin's repository at the pin's commit (reused across pins of one repo)."""
    folder = SOURCES / pin.repo.rstrip("/").split("/")[-1]
    if not (folder / ".git").is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "--quiet", "--filter=blob:none", pin.repo, str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "checkout", "--quiet", "--force", pin.commit], check=True)
    subprocess.run(["git", "-C", str(folder), "clean", "--quiet", "-fdx"], check=True)
    head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    if not head.startswith(pin.commit):
        raise UpstreamError(f"{pin.name}: {folder} is at {head}, not the pin's {pin.commit}")
    return folder


def from_source(pin: Pin) -> Path:
    folder = checkout(pin)
    pin.fetched.parent.mkdir(parents=True, exist_ok=True)
    if pin.kind == "tests":
        subprocess.run(["git", "-C", str(folder), "archive", "--format=tar.gz", "--prefix=nki-library/",
                        "-o", str(pin.fetched), pin.commit, "src", "test"], check=True)
        return pin.fetched
    if pin.name == "torchtitan-spring2026":
        # Labelled as the pin says, so it is never taken for PyPI's 0.2.2 (a TOML-configured release).
        (folder / "assets" / "version.txt").write_text(pin.version + "\n")
    built = UPSTREAM_DIR / "build-wheel"
    shutil.rmtree(built, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(built), str(folder)], check=True)
    wheels = sorted(built.glob("*.whl"))
    if [w.name for w in wheels] != [pin.artifact]:
        raise UpstreamError(f"{pin.name}: building {folder} at {pin.commit} gave "
                            f"{[w.name for w in wheels]}, not {pin.artifact} (version {pin.version})")
    shutil.move(str(wheels[0]), pin.fetched)
    return pin.fetched


def install(pin: Pin, artifact: Path) -> None:
    if pin.kind == "wheel":
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--force-reinstall", str(artifact)], check=True)
    elif pin.kind == "venv":
        subprocess.run([str(REPO / "scripts" / "make_titan_venv.sh")], check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "TITAN_WHEEL_DIR": str(artifact.parent)})
    # "tests": the tarball under build/upstream/ is what scripts/nkilib_tests.py extracts.


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"pins to install (default: all: {', '.join(pins())})")
    parser.add_argument("--mirror", type=Path, default=None,
                        help="an offline mirror: <DIR>/<mirror_dir>/<artifact> for each pin")
    parser.add_argument("--list", action="store_true", help="list the pins and whether each is installed")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(pins()))
    if unknown:
        parser.error(f"no pin named {unknown}; pins: {', '.join(pins())} (constraints/upstream.toml)")
    chosen = [pins()[n] for n in (args.names or pins())]
    if args.list:
        for pin in chosen:
            state = "installed" if pin.installed() else "missing  "
            print(f"{pin.name:24} {state}  {pin.repo} @ {pin.commit}  ({pin.kind})")
        return 0
    if args.mirror is not None and not args.mirror.is_dir():
        parser.error(f"--mirror {args.mirror} is not a folder")
    for pin in chosen:
        try:
            artifact = from_mirror(pin, args.mirror) if args.mirror else from_source(pin)
            install(pin, artifact)
        except (UpstreamError, subprocess.CalledProcessError) as error:
            print(f"get_upstream: {pin.name}: {error}", file=sys.stderr)
            return 1
        where = f"mirror {args.mirror}" if args.mirror else pin.repo
        print(f"get_upstream: {pin.name} {pin.version} ({pin.commit}) from {where}: {pin.kind} ready")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

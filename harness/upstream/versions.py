"""The versions every result records: the packages under test, the torchtitan API
generation (harness/upstream/titan_api) and the harness's own commit. Read by the launcher,
the lint and the reports alike."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from harness.registry import generations, paths

VERSIONED_PACKAGES = ("torch", "torchtitan", "transformers", "safetensors", "torch-neuronx")


def package_versions() -> dict[str, str]:
    """The versions every result records, with the torchtitan API generation."""
    # The generation is read off the installed version (harness/registry/generations.py), not
    # off the API module: importing that imports torchtitan's models (about 3 CPU s in a process
    # that launches runs and computes nothing, such as the prefetcher).
    installed = generations.installed_version()
    versions = {"python": sys.version.split()[0]}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    versions["torchtitan-generation"] = generations.generation_of(installed)
    versions["torchtitan-api"] = generations.api_generation_of(versions["torchtitan-generation"])
    note = generations.fork_note(installed)
    if note:
        versions["torchtitan-unknown-fork"] = note
    return versions


def code_commit() -> str:
    """The harness's git commit (with "+dirty" for uncommitted changes), or "unknown"."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=paths.REPO_ROOT, capture_output=True, text=True,
                              timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"

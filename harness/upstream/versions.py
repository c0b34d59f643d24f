"""The versions every result records: the packages under test and the torchtitan API
generation (harness/upstream/titan_api). Read by the launcher, the lint and the reports alike."""

from __future__ import annotations

import sys
from importlib import metadata

VERSIONED_PACKAGES = ("torch", "torchtitan", "transformers", "safetensors", "torch-neuronx")


def package_versions() -> dict[str, str]:
    """The versions every result records, with the torchtitan API generation."""
    from harness.upstream.titan_api import TORCHTITAN_VERSION, api_generation, fork_note, generation

    versions = {"python": sys.version.split()[0]}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    versions["torchtitan-generation"] = generation()
    versions["torchtitan-api"] = api_generation()
    note = fork_note(TORCHTITAN_VERSION)
    if note:
        versions["torchtitan-unknown-fork"] = note
    return versions

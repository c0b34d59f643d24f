#!/usr/bin/env python3
"""Nightly step "Compiler versions": the compile cache's key scope, as a step output.

    python3 scripts/nightly/cache_key.py >> "$GITHUB_OUTPUT"

A NEFF compiled by one neuronx-cc / torch-neuronx is not reused by another, so the cache key
names both (the nightly restores the newest cache of the same scope)."""

from __future__ import annotations

from importlib import metadata


def version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


def scope() -> str:
    return f"cc{version('neuronx-cc')}-tnx{version('torch-neuronx')}"


if __name__ == "__main__":
    print(f"scope={scope()}")

"""The upstreams the harness pins beyond PyPI (constraints/upstream.toml), and whether each is
installed here. A test that needs one skips with ``missing(name)``: what is absent and the one
command that installs it (scripts/get_upstream.py), never a failure for its absence.
"""

from __future__ import annotations

import importlib.util
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness.registry import paths

PINS_FILE = paths.REPO_ROOT / "constraints" / "upstream.toml"
INSTALLER = "python3 scripts/get_upstream.py"
UPSTREAM_DIR = paths.REPO_ROOT / "build" / "upstream"  # fetched artifacts, git-ignored
KINDS = ("wheel", "venv", "tests")


@dataclass(frozen=True)
class Pin:
    name: str
    what: str
    repo: str
    commit: str
    version: str
    artifact: str
    mirror_dir: str
    sha256: str
    probe: str
    kind: str

    @property
    def install(self) -> str:
        return f"{INSTALLER} {self.name}"

    @property
    def fetched(self) -> Path:
        """Where scripts/get_upstream.py puts the artifact (mirror or source)."""
        return UPSTREAM_DIR / self.mirror_dir / self.artifact

    def installed(self) -> bool:
        if self.kind == "wheel":
            return importlib.util.find_spec(self.probe) is not None
        return (paths.REPO_ROOT / self.probe).exists()


@cache
def pins() -> dict[str, Pin]:
    data = tomllib.loads(PINS_FILE.read_text())
    table = {name: Pin(name=name, **fields) for name, fields in data.items()}
    for pin in table.values():
        if pin.kind not in KINDS:
            raise ValueError(f"{PINS_FILE}: [{pin.name}] kind {pin.kind!r} is not one of {KINDS}")
    return table


def pin(name: str) -> Pin:
    try:
        return pins()[name]
    except KeyError:
        raise KeyError(f"no upstream pin {name!r} in {PINS_FILE}; pins: {sorted(pins())}") from None


def missing(name: str) -> str | None:
    """None where the pinned upstream ``name`` is installed; else why a test needing it skips:
    what is absent and the one command that installs it."""
    entry = pin(name)
    if entry.installed():
        return None
    return (f"{entry.name} ({entry.repo} at {entry.commit}) is not installed here: "
            f"`{entry.install}` installs it")

"""The torchtitan API generations by name: which versions each accepts, which is a fork of
which, and how to install each. No torchtitan import (harness/upstream/titan_api imports the installed
one): the known-issue registry reads these too (a fork inherits its base's known issues).

| generation            | torchtitan versions | where it comes from                                    |
|-----------------------|---------------------|--------------------------------------------------------|
| ``v0_3``              | ``0.3.0``           | PyPI (``pip install -e . -c constraints/cpu.txt``)     |
| ``spring2026``        | ``0.2.2+main.*``    | torchtitan ``main`` of spring 2026 (1)                 |
| ``spring2026-neuron`` | ``0.2.2+neuron*``   | TorchTitan Neuron 0.2.2+neuron.1 (Neuron SDK 2.33) (2) |

(1) ``python3 scripts/get_upstream.py torchtitan-spring2026``.
(2) A fork of that ``main``.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from packaging.specifiers import SpecifierSet

# generation -> (what it accepts, how to install it)
SUPPORTED: dict[str, tuple[str, str]] = {
    "v0_3": (
        "torchtitan 0.3.0",
        "python3 -m pip install -e . -c constraints/cpu.txt",
    ),
    "spring2026": (
        "torchtitan 0.2.2+main.* (main of spring 2026)",
        "python3 scripts/get_upstream.py torchtitan-spring2026 (its venv, .venv-titan-spring2026)",
    ),
    "spring2026-neuron": (
        "torchtitan 0.2.2+neuron* (TorchTitan Neuron, a fork of spring-2026 main)",
        "on the Neuron image: git clone https://github.com/aws-neuron/torchtitan-neuron, "
        "`pip install -e .` in the image's venv, then "
        "`pip install -e . -c <(python3 constraints/neuron_image.py)` here",
    ),
}
# The rest of the stack every generation runs on: the Neuron SDK 2.33's torch (torch-neuronx
# 2.14.3.x is built for torch 2.14.0; both torchtitan generations import torch 2.14 APIs, e.g.
# ``DataParallelMeshDims``) and the transformers v5 that torchtitan 0.3.0's transformers backend
# was written against. pyproject.toml's dependency ranges say the same (a test holds them equal).
STACK: dict[str, str] = {"torch": ">=2.14.0,<2.15", "transformers": ">=5.9.0,<6"}
# The one command that installs a supported stack on a CPU machine (a Neuron image: README).
CPU_INSTALL = "python3 -m pip install -e . -c constraints/cpu.txt"
# The API module of each generation (harness/upstream/titan_api/<module>.py).
API_OF = {"v0_3": "v0_3", "spring2026": "spring2026", "spring2026-neuron": "spring2026"}
# A fork and the generation it forks: the fork inherits the base's known issues
# (harness/registry/known_issues/: expected where their signature reproduces, named "inherited").
FORK_OF = {"spring2026-neuron": "spring2026"}
# TorchTitan Neuron releases the harness has been checked against (Neuron SDK 2.33).
KNOWN_FORK_VERSIONS = ("0.2.2+neuron.1",)


class UnsupportedTorchtitanError(RuntimeError):
    pass


def generation_of(version: str) -> str:
    """The API generation of a torchtitan version string."""
    if version == "0.3.0":
        return "v0_3"
    if re.fullmatch(r"0\.2\.2\+main\.[0-9a-f]+", version):
        return "spring2026"
    if is_fork(version):
        return "spring2026-neuron"
    supported = "; ".join(
        f"{name}: {accepts} (install: {how})" for name, (accepts, how) in SUPPORTED.items()
    )
    raise UnsupportedTorchtitanError(
        f"torchtitan {version} is not a supported API generation. Supported: {supported}."
    )


def is_fork(version: str) -> bool:
    """A TorchTitan Neuron build (``0.2.2+neuron*``)."""
    return re.fullmatch(r"0\.2\.2\+neuron.*", version) is not None


def fork_note(version: str) -> str | None:
    """None for a known fork release (or no fork); else what a result must say about it."""
    if not is_fork(version) or version in KNOWN_FORK_VERSIONS:
        return None
    return (f"TorchTitan Neuron {version} is not a release the harness knows "
            f"(known: {', '.join(KNOWN_FORK_VERSIONS)}): run as spring2026-neuron (the spring2026 "
            f"API); its expectations are those of {KNOWN_FORK_VERSIONS[-1]}, and the known issues "
            f"of spring2026 are expected where their signatures reproduce (inherited)")


def api_generation_of(name: str) -> str:
    """The API module of generation ``name`` (a fork shares its base's)."""
    return API_OF[name]


def base_of(name: str) -> str | None:
    """The generation fork ``name`` was forked from; None for a generation that is no fork."""
    return FORK_OF.get(name)


def installed_version() -> str:
    """The installed torchtitan's version, read from its metadata (torchtitan is not imported)."""
    try:
        return metadata.version("torchtitan")
    except metadata.PackageNotFoundError as error:
        raise UnsupportedTorchtitanError(
            "torchtitan is not installed; install it with "
            f"`{SUPPORTED['v0_3'][1]}` or build the spring-2026 venv with "
            f"`{SUPPORTED['spring2026'][1]}`"
        ) from error


def installed_generation() -> str:
    """The installed generation's name ("v0_3", "spring2026" or "spring2026-neuron")."""
    return generation_of(installed_version())


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


EXIT_UNSUPPORTED = 4  # pytest.ExitCode.USAGE_ERROR, for a command line too


def require_supported_stack() -> None:
    """A command line's first call: on an unsupported stack, the one line and exit status 4."""
    problem = unsupported_stack()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(EXIT_UNSUPPORTED)


def unsupported_stack() -> str | None:
    """None where the installed (torch, torchtitan, transformers) is a supported combination;
    else one line: what is installed, what is needed, and the command that fixes it. Reads
    package metadata only (nothing is imported), so it answers where torchtitan cannot import."""
    versions = {name: installed(name) for name in ("torch", "torchtitan", "transformers")}
    problems = []
    titan = versions["torchtitan"]
    if titan is None:
        accepts = " or ".join(accepts for accepts, _ in SUPPORTED.values())
        problems.append(f"torchtitan is not installed (needs {accepts})")
    else:
        try:
            generation_of(titan)
        except UnsupportedTorchtitanError:
            problems.append(f"torchtitan {titan} is no supported generation (needs "
                            f"{' or '.join(accepts for accepts, _ in SUPPORTED.values())})")
    for name, spec in STACK.items():
        version = versions[name]
        if version is None:
            problems.append(f"{name} is not installed (needs {name}{spec})")
        elif not SpecifierSet(spec).contains(version, prereleases=True):
            problems.append(f"{name} {version} is installed, torchtitan "
                            f"{titan or '(any generation)'} and the harness need {name}{spec}")
    if not problems:
        return None
    return (f"unsupported environment: {'; '.join(problems)}. Fix: {CPU_INSTALL} "
            f"(on a Neuron image, keep its torch and install TorchTitan Neuron first: README.md)")

"""The one refusal of an environment the harness cannot run in (harness/registry/generations.py
``unsupported_stack``), before anything imports torch or torchtitan: the pytest plugin
(``-p harness.cli.environment``, pyproject.toml addopts) stops a session before collection, and
every command line (``python -m harness``, ``python -m harness.kernels.checks``) calls
``require_supported_stack`` first. One line, exit status 4 (pytest's usage error) either way.
"""

from __future__ import annotations

import sys

from harness.registry.generations import unsupported_stack

EXIT_UNSUPPORTED = 4  # pytest.ExitCode.USAGE_ERROR


def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """Runs before pytest's own implementation of this hook loads conftest.py (a plugin named
    with -p registers after it, and pluggy calls the later registration first)."""
    problem = unsupported_stack()
    if problem is not None:
        import pytest  # the command lines above need no pytest

        raise pytest.UsageError(problem)


def require_supported_stack() -> None:
    problem = unsupported_stack()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(EXIT_UNSUPPORTED)

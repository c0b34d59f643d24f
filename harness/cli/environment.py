"""The pytest side of the one refusal of an environment the harness cannot run in
(harness/registry/generations.py ``unsupported_stack``): loaded with ``-p harness.cli.environment``
(pyproject.toml addopts), it stops a session before conftest.py imports torch or torchtitan,
with one line and exit status 4 (pytest's usage error). Command lines call
``generations.require_supported_stack`` first, to the same effect.
"""

from __future__ import annotations

from harness.registry.generations import unsupported_stack


def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """Runs before pytest's own implementation of this hook loads conftest.py (a plugin named
    with -p registers after it, and pluggy calls the later registration first)."""
    problem = unsupported_stack()
    if problem is not None:
        import pytest  # noqa: PLC0415  only where a session runs: the command lines need no pytest

        raise pytest.UsageError(problem)

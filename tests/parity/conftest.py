"""Parity suite configuration: the models under comparison, the data, and opt-in workarounds.

Models are built once per session from the fixtures (in-process, no torchrun) and shared by
read-only tests; tests that train or perturb build their own.

Workarounds for the named upstream defects (harness/parity/defects.py) are never applied by
default. Ask for them with ``--parity-workaround NAME`` (repeatable; ``all``), the
``PARITY_WORKAROUNDS`` environment variable (comma-separated; works from any directory), or,
for ``hf_rope_init``, the root ``--workaround``. Known names: hf_rope_init, hf_block_causal,
titan_4b_theta.
"""

from __future__ import annotations

import os

import pytest
import torch

from harness.backends import paths
from harness.launch import package_versions
from harness.parity import defects
from harness.parity import models as M

ENV_VAR = "PARITY_WORKAROUNDS"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("parity")
    group.addoption("--parity-workaround", action="append", default=[], metavar="NAME",
                    choices=[*defects.WORKAROUNDS, "all"],
                    help="apply an opt-in workaround for a named upstream defect in the parity "
                         f"suite ({', '.join(defects.WORKAROUNDS)}, or all); also ${ENV_VAR}")


def pytest_report_header(config: pytest.Config) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in package_versions().items())
    return f"parity: {versions}; workarounds: {sorted(_requested(config)) or 'none'}"


def _requested(config: pytest.Config) -> set[str]:
    names = set(os.environ.get(ENV_VAR, "").replace(" ", "").split(",")) - {""}
    try:
        names |= set(config.getoption("--parity-workaround") or [])
    except ValueError:  # option not registered (this conftest loaded after option parsing)
        pass
    if "all" in names:
        names = set(defects.WORKAROUNDS)
    unknown = names - set(defects.WORKAROUNDS)
    if unknown:
        raise pytest.UsageError(f"unknown parity workaround(s) {sorted(unknown)} in --parity-workaround / "
                                f"${ENV_VAR}; known: {list(defects.WORKAROUNDS)}")
    try:  # the root --workaround (upstream shims for every backend run): the parity ones only
        names |= set(config.getoption("--workaround") or []) & set(defects.WORKAROUNDS)
    except ValueError:
        pass
    return names


@pytest.fixture(scope="session")
def parity_workarounds(pytestconfig: pytest.Config) -> frozenset[str]:
    return frozenset(_requested(pytestconfig))


@pytest.fixture(scope="session")
def versions() -> dict[str, str]:
    return package_versions()


def _fixture_dir(path):
    if not (path / "config.json").is_file() or not list(path.glob("*.safetensors")):
        pytest.fail(f"fixture {path} is missing or incomplete: regenerate it with "
                    f"`python scripts/make_fixtures.py --only {path.name}`")
    return path


@pytest.fixture(scope="session")
def dense_dir():
    return _fixture_dir(paths.TINY_DENSE)


@pytest.fixture(scope="session")
def moe_dir():
    return _fixture_dir(paths.TINY_MOE)


@pytest.fixture(scope="session")
def dense_batch(dense_dir) -> M.Batch:
    """The first batch torchtitan's dataloader gives one rank (2 x 256 tokens, packed
    documents with per-document positions)."""
    return M.load_batches(dense_dir, 1)[0][0]


@pytest.fixture(scope="session")
def moe_batch(moe_dir) -> M.Batch:
    return M.load_batches(moe_dir, 1)[0][0]


@pytest.fixture(scope="session")
def dense_models(dense_dir) -> dict[str, M.ParityModel]:
    return {"hf": M.load_hf(dense_dir), "native": M.build_native(dense_dir),
            "reference": M.reference_model(dense_dir)}


@pytest.fixture(scope="session")
def moe_models(moe_dir) -> dict[str, M.ParityModel]:
    return {"hf": M.load_hf(moe_dir), "native": M.build_native(moe_dir),
            "custom_ops": M.build_native(moe_dir, custom_ops=True),
            "reference": M.reference_model(moe_dir),
            "reference_bf16_experts": M.reference_model(moe_dir, expert_dtype=torch.bfloat16)}


@pytest.fixture(scope="session")
def activations():
    """Memoised ``record_activations`` per (model, batch) for the shared read-only models."""
    cache: dict = {}

    def get(model: M.ParityModel, batch: M.Batch):
        key = (id(model), id(batch))
        if key not in cache:
            cache[key] = model.record_activations(batch)
        return cache[key]

    return get

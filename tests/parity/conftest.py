"""Parity suite configuration: the models under comparison and the data.

Models are built once per session from the fixtures (in-process, no torchrun) and shared by
read-only tests; tests that train or perturb build their own.

Known upstream issues come from the one registry, harness/registry/known_issues/, and a test ends on
its verdict with ``known_issues.settle``. Their workarounds are never applied by default: ask
with the root ``--workaround NAME`` (validated against ``known_issues.WORKAROUNDS``; read here through
the root session fixture ``workarounds``).
"""

from __future__ import annotations

import pytest
import torch

from harness.device.devices import TIER_MARKERS
from harness.launch.run_matrix import layout_cases
from harness.parity import models as M
from harness.references.batch import Batch
from harness.registry import paths
from harness.upstream.versions import package_versions


def pytest_report_header(config: pytest.Config) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in package_versions().items())
    return f"parity: {versions}; workarounds: {sorted(config.getoption('--workaround', default=None) or []) or 'none'}"


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
def dense_batch(dense_dir) -> Batch:
    """The first batch torchtitan's dataloader gives one rank (2 x 256 tokens, packed
    documents with per-document positions)."""
    return M.dataloader_batches(dense_dir, 1)[0][0]


@pytest.fixture(scope="session")
def moe_batch(moe_dir) -> Batch:
    return M.dataloader_batches(moe_dir, 1)[0][0]


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

    def get(model: M.ParityModel, batch: Batch):
        key = (id(model), id(batch))
        if key not in cache:
            cache[key] = model.record_activations(batch)
        return cache[key]

    return get


def _layout_param(case):
    marks = [getattr(pytest.mark, TIER_MARKERS[case.device])] if case.device in TIER_MARKERS else []
    if case.slow:
        marks.append(pytest.mark.slow)
    return pytest.param(case, id=case.id, marks=marks)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The layouts' runs (harness/launch/run_matrix.py ``layout_cases``), marked with their
    tier; ``fsdp_layout_case``: those that read the FSDP run's own batches;
    ``moe_fsdp_layout_case``: those of them that train an MoE."""
    if "layout_case" in metafunc.fixturenames:
        metafunc.parametrize("layout_case", [_layout_param(c) for c in layout_cases()], scope="module")
    same_rows = [c for c in layout_cases() if c.layout_spec.same_batches_as_fsdp]
    if "fsdp_layout_case" in metafunc.fixturenames:
        metafunc.parametrize("fsdp_layout_case", [_layout_param(c) for c in same_rows], scope="module")
    if "moe_fsdp_layout_case" in metafunc.fixturenames:
        metafunc.parametrize("moe_fsdp_layout_case", [_layout_param(c) for c in same_rows
                                                      if c.model_kind == "moe"], scope="module")

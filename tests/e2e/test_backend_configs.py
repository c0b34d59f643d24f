"""Every backend's config function builds a model of the size its HF config.json describes.

Runs on the meta device (no memory, no weights): the full-size configs the Trainium tier
launches are checked here on every commit, not first on the trn2 runner.
"""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from harness.backends import BACKENDS, SIZES, paths
from harness.backends import hf_v5, nki_moe, titan_native  # noqa: F401  (config modules)
from harness.metrics_sink import JsonlMetricsProcessor

MODULES = {"hf_v5": hf_v5, "titan_native": titan_native, "nki_moe": nki_moe}
HF_CONFIG_DIRS = {
    ("hf_v5", "tiny"): paths.TINY_DENSE,
    ("titan_native", "tiny"): paths.TINY_DENSE,
    ("nki_moe", "tiny"): paths.TINY_MOE,
    ("titan_native", "full"): paths.FIXTURES / "reference_configs" / "Qwen3-4B-Instruct-2507",
    ("nki_moe", "full"): nki_moe.FULL_SHAPE,
}


def _hf_parameter_count(config_dir) -> int:
    config = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_config_function_builds_a_trainer_config(backend, size):
    config = getattr(MODULES[backend], size)()
    assert isinstance(config.metrics, JsonlMetricsProcessor.Config), "the harness's sink is wired"
    assert config.debug.seed is not None and config.debug.deterministic


@pytest.mark.parametrize("backend,size", [k for k in HF_CONFIG_DIRS if k[0] != "hf_v5"])
def test_native_model_has_the_hf_models_parameter_count(backend, size):
    spec = getattr(MODULES[backend], size)().model_spec
    with torch.device("meta"):
        model = spec.model.build()
    native = sum(p.numel() for p in model.parameters())
    expected = _hf_parameter_count(HF_CONFIG_DIRS[(backend, size)])
    assert native == expected, f"{backend}/{size}: native {native:,} parameters, HF {expected:,}"


def test_tiny_hf_v5_reads_the_fixture_config():
    config = hf_v5.tiny()
    assert json.loads((paths.TINY_DENSE / "config.json").read_text())["architectures"] == [
        "Qwen3ForCausalLM"]
    assert config.hf_model == str(paths.TINY_DENSE) == config.hf_assets_path


def test_catches_a_dense_model_built_from_a_moe_config(monkeypatch):
    """The defect this harness once had: transformers 5 writes num_local_experts, not num_experts."""
    from harness.backends import native_qwen3

    monkeypatch.setattr(native_qwen3, "num_experts", lambda hf: 0)
    with torch.device("meta"):
        model = nki_moe.tiny().model_spec.model.build()
    native = sum(p.numel() for p in model.parameters())
    assert native != _hf_parameter_count(paths.TINY_MOE)

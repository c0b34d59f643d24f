"""Every registered backend's config functions build a trainer config, and the native models
have the parameter count of the HF model their config.json describes.

Runs on the meta device (no memory, no weights): the full-size configs the Trainium tier
launches are checked here on every commit, not first on the trn2 runner. Generated from the
backend registry (harness/backends).
"""

import importlib

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from harness.backends import ASSETS_MODEL, BACKENDS, native_qwen3
from harness.launch.run import RunSpec
from harness.registry import paths
from harness.upstream.metrics_sink import JsonlMetricsProcessor

# Stand-in for the assets dir of the full-size runs: the published config.json of the model.
REFERENCE_ASSETS = paths.FIXTURES / "reference_configs" / ASSETS_MODEL

CONFIGS = [(b.name, size, attention) for b in BACKENDS.values() for size in b.sizes
           for attention in b.attention]


def _config(backend: str, size: str, attention: str):
    spec = BACKENDS[backend]
    module = importlib.import_module(spec.module)
    return getattr(module, spec.config_name(size, attention))()


def _hf_parameter_count(config_dir) -> int:
    config = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _model_dir(backend: str, size: str):
    size_spec = BACKENDS[backend].size(size)
    assets = paths.FIXTURES / "reference_configs" / size_spec.assets if size_spec.assets else REFERENCE_ASSETS
    return RunSpec(backend, size=size, hf_assets_path=str(assets)).model_dir()


@pytest.mark.parametrize("backend,size,attention", CONFIGS)
def test_config_function_builds_a_trainer_config(backend, size, attention):
    config = _config(backend, size, attention)
    assert isinstance(config.metrics, JsonlMetricsProcessor.Config), "the harness's sink is wired"
    assert config.debug.seed is not None and config.debug.deterministic


NATIVE = [(b, s, a) for b, s, a in CONFIGS if b != "hf_v5"]


@pytest.mark.parametrize("backend,size,attention", NATIVE)
def test_native_model_has_the_hf_models_parameter_count(backend, size, attention):
    spec = _config(backend, size, attention).model_spec
    with torch.device("meta"):
        model = spec.model.build()
    native = sum(p.numel() for p in model.parameters())
    expected = _hf_parameter_count(_model_dir(backend, size))
    assert native == expected, f"{backend}/{size}: native {native:,} parameters, HF {expected:,}"


def test_tiny_hf_v5_reads_the_fixture_config():
    config = _config("hf_v5", "tiny", "causal")
    assert config.hf_model == str(paths.TINY_DENSE) == config.hf_assets_path


def test_catches_a_dense_model_built_from_a_moe_config(monkeypatch):
    """The defect this harness once had: transformers 5 writes num_local_experts, not num_experts."""
    monkeypatch.setattr(native_qwen3, "num_experts", lambda hf: 0)
    with torch.device("meta"):
        model = _config("nki_moe", "tiny", "sdpa").model_spec.model.build()
    native = sum(p.numel() for p in model.parameters())
    assert native != _hf_parameter_count(paths.TINY_MOE)

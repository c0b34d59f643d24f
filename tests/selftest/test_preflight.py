"""Broken inputs are refused before any rank starts, naming the file and the fix."""

import json
import shutil

import pytest

from harness.launch.preflight import PreflightError, _fix_for, check_run_inputs
from harness.launch.run import RunSpec, launch
from harness.registry import paths


@pytest.fixture
def model_copy(tmp_path):
    target = tmp_path / "tiny_dense"
    shutil.copytree(paths.TINY_DENSE, target)
    return target


def test_the_committed_fixtures_pass():
    check_run_inputs(paths.TINY_DENSE, paths.TINY_DENSE, paths.TINY_DENSE)
    check_run_inputs(paths.TINY_MOE, paths.TINY_MOE, paths.TINY_MOE)


def test_truncated_safetensors(model_copy):
    weights = model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(PreflightError,
                       match=r"model\.safetensors: truncated: tensors need \d+ bytes, the file has \d+; re-download"):
        check_run_inputs(model_copy, model_copy, model_copy)


def test_a_broken_fixture_points_at_the_fixture_script():
    assert "scripts/make_fixtures.py" in _fix_for(paths.TINY_DENSE / "model.safetensors")


def test_corrupt_safetensors_header(model_copy):
    (model_copy / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(PreflightError, match=r"model\.safetensors: not a readable safetensors"):
        check_run_inputs(model_copy, model_copy, model_copy)


def test_missing_tokenizer(model_copy):
    (model_copy / "tokenizer.json").unlink()
    with pytest.raises(PreflightError, match=r"tokenizer\.json is missing.*hf_assets_path"):
        check_run_inputs(model_copy, model_copy, None)


def test_index_listing_a_missing_shard(model_copy):
    (model_copy / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(PreflightError, match=r"lists shard\(s\) \['model-00002-of-00002"):
        check_run_inputs(model_copy, model_copy, model_copy)


def test_inconsistent_config(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["num_key_value_heads"] = 3  # 4 heads cannot be grouped by 3
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(PreflightError, match=r"config\.json: inconsistent config: num_attention_heads=4"):
        check_run_inputs(model_copy, model_copy, None)


def test_tokenizer_larger_than_the_vocab(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["vocab_size"] = 1000
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(PreflightError, match=r"has 2048 tokens but .* vocab_size=1000"):
        check_run_inputs(model_copy, model_copy, None)


def test_launch_refuses_before_starting_ranks(tmp_path, device_profile):
    spec = RunSpec("titan_native", size="full", init="pretrained", hf_assets_path=str(tmp_path))
    with pytest.raises(PreflightError, match=r"config\.json is missing"):
        launch(spec, device_profile, tmp_path / "run")
    assert not (tmp_path / "run").exists()

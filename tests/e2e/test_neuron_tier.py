"""The source's runs at full size on trn2.48xlarge (64 NeuronCores at LNC=2), nightly.

Same checks as the CPU tier (tests/e2e/test_backend_runs.py), on the real shapes: the
transformers backend and native Qwen3 with Qwen3-4B-Instruct-2507, and the NKI MoE (30B-A3B
shape cut to 4 layers, 64 experts, top-4); local batch 1 on 64 ranks, 10 steps.
"""

from pathlib import Path

import pytest

from harness import known_defects
from harness.backends import model_name
from harness.expectations import ExpectationRegistry, MissingExpectation
from harness.launch import RunSpec
from harness.results import RunFailed

ASSETS = "Qwen3-4B-Instruct-2507"
REQUIRED_ASSET_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
DOWNLOAD = (
    "huggingface-cli download Qwen/Qwen3-4B-Instruct-2507 --local-dir <assets-dir>/Qwen3-4B-Instruct-2507"
)

CASES = [
    ("hf_v5", "pretrained"),
    ("titan_native", "pretrained"),
    ("hf_v5", "random"),
    ("titan_native", "random"),
    ("nki_moe", "random"),
]


@pytest.fixture(scope="session")
def qwen3_4b_assets(pytestconfig) -> Path:
    root = pytestconfig.getoption("--assets-dir")
    if root is None:
        pytest.skip(f"--assets-dir not given; fetch the assets with: {DOWNLOAD}")
    path = Path(root) / ASSETS
    missing = [f for f in REQUIRED_ASSET_FILES if not (path / f).is_file()]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        pytest.skip(f"{path} lacks {missing}; fetch the assets with: {DOWNLOAD}")
    return path


@pytest.mark.neuron
@pytest.mark.parametrize("backend,init", CASES)
def test_full_size_first_step_loss(backend, init, backend_runs, qwen3_4b_assets, device_profile,
                                   steps, request):
    for defect in known_defects.for_run(backend, init, "full"):
        request.applymarker(defect.xfail())
    run = backend_runs.get(
        RunSpec(backend=backend, size="full", init=init, steps=steps,
                hf_assets_path=str(qwen3_4b_assets), timeout_s=3 * 3600)
    )
    if not run.ok:
        raise RunFailed(run, "the full-size run did not finish cleanly")
    try:
        expectation = ExpectationRegistry().get(backend, model_name(backend, "full"), init,
                                                device_profile.kind)
    except MissingExpectation as error:
        pytest.fail(str(error))
    problem = expectation.check(run.steps[0].loss)
    assert problem is None, f"{problem}\n{run.describe()}"

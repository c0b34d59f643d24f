"""The full-size code path's inputs and neuron-only settings, checked on CPU in-process.

- the assets twin is laid out as `hf download Qwen/Qwen3-4B-Instruct-2507 --local-dir DIR` lays
  out the real folder, key for key, and holds every weight of the fixture it was built from;
- the MoE's assets are its own: no foreign index (the 4B index as torchtitan's HF save map
  lacks every MoE key: the save raised KeyError in torch's HuggingFaceStorageWriter);
- TorchTitan Neuron is its own generation: spring2026's known issues do not apply to it, an
  unknown fork release says so, expectations are the spring2026 API's;
- the neuron rank environment (auto-cast, core visibility) and the C4 data flags are pure
  functions of their inputs;
- the independent HF-forward expectation tells the masks apart (a mask mix-up fails it).
"""

import argparse
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from harness.checks.reference_forward import independent_first_step_loss
from harness.cli.commands import _specs
from harness.device.devices import NEURON_CORE_VISIBILITY, neuron_profile, neuron_rank_env, profile_for
from harness.launch.run import RunSpec, build_command, rank_environment
from harness.launch.run_matrix import FULL_OVERRIDES, TWIN_OVERRIDES, RunCase
from harness.references.batch import Batch
from harness.references.expected_loss import expected_loss
from harness.registry import known_issues, paths
from harness.registry.assets_twin import (
    DENSE_ASSETS,
    INDEX,
    MOE_ASSETS,
    build_twin,
    derived_assets,
    full_size_assets_dir,
)
from harness.registry.tolerances import loss_band
from harness.upstream import titan_api

SHARD = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")


@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> Path:
    return build_twin(tmp_path_factory.mktemp("twin"))


def _keys(path: Path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


def _index_layout_problems(folder: Path, source: Path) -> list[str]:
    """How ``folder`` differs from a sharded `hf download` of the model in ``source``."""
    problems = []
    files = sorted(p.name for p in folder.iterdir())
    for needed in ("config.json", "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json", INDEX):
        if needed not in files:
            problems.append(f"missing {needed}")
    shards = [f for f in files if f.endswith(".safetensors")]
    if not shards or not all(SHARD.fullmatch(f) for f in shards):
        problems.append(f"shard names {shards}")
        return problems
    total = {int(SHARD.fullmatch(f).group(2)) for f in shards}
    if total != {len(shards)} or sorted(int(SHARD.fullmatch(f).group(1)) for f in shards) != list(
            range(1, len(shards) + 1)):
        problems.append(f"shards {shards} are not 1..n of n")
    index = json.loads((folder / INDEX).read_text())
    if set(index) != {"metadata", "weight_map"}:
        problems.append(f"index keys {sorted(index)}")
    weight_map = index["weight_map"]
    for shard in shards:
        if {k for k, v in weight_map.items() if v == shard} != _keys(folder / shard):
            problems.append(f"weight_map disagrees with {shard}")
    expected_keys = _keys(source / "model.safetensors")
    if set(weight_map) != expected_keys:
        problems.append(f"weight_map keys differ from {source.name}'s")
    size = 0
    for shard in shards:
        with safe_open(str(folder / shard), "pt") as f:
            size += sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())
    if index["metadata"].get("total_size") != size:
        problems.append(f"metadata.total_size {index['metadata'].get('total_size')} != {size}")
    return problems


def test_twin_is_laid_out_as_the_hf_download(twin):
    dense = twin / DENSE_ASSETS
    assert _index_layout_problems(dense, paths.TINY_DENSE) == []
    assert len(list(dense.glob("model-*.safetensors"))) == 3, "Qwen3-4B-Instruct-2507 has 3 shards"
    assert (dense / "config.json").read_bytes() == (paths.TINY_DENSE / "config.json").read_bytes()
    hf = json.loads((dense / "config.json").read_text())
    assert hf["tie_word_embeddings"] and hf["head_dim"] != hf["hidden_size"] // hf["num_attention_heads"]
    assert "lm_head.weight" not in json.loads((dense / INDEX).read_text())["weight_map"], "tied"


def test_layout_check_catches_a_broken_index(twin, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(twin / DENSE_ASSETS, broken)
    index = json.loads((broken / INDEX).read_text())
    index["metadata"]["total_size"] += 1
    index["weight_map"].pop(next(iter(index["weight_map"])))
    (broken / INDEX).write_text(json.dumps(index))
    problems = _index_layout_problems(broken, paths.TINY_DENSE)
    assert any("total_size" in p for p in problems) and any("weight_map" in p for p in problems)


def test_moe_assets_have_no_foreign_index(twin):
    moe = twin / MOE_ASSETS
    assert not (moe / INDEX).exists() and not list(moe.glob("*.safetensors"))
    assert (moe / "config.json").read_bytes() == (paths.TINY_MOE / "config.json").read_bytes()
    # Why: torchtitan's HF save map is the assets' index; the MoE's keys are not in the 4B's.
    dense_map = json.loads((twin / DENSE_ASSETS / INDEX).read_text())["weight_map"]
    moe_keys = _keys(paths.TINY_MOE / "model.safetensors")
    assert {k for k in moe_keys if ".mlp.gate." in k} - set(dense_map), "MoE router keys absent"


def test_moe_assets_are_derived_when_the_runner_has_none(twin, tmp_path):
    root = tmp_path / "root"
    (root / DENSE_ASSETS).mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / DENSE_ASSETS / name).write_bytes((twin / DENSE_ASSETS / name).read_bytes())
    reference = paths.FIXTURES / "reference_configs" / MOE_ASSETS
    built = full_size_assets_dir(MOE_ASSETS, root, reference, tmp_path / "work")
    assert built == tmp_path / "work" / MOE_ASSETS
    assert (built / "config.json").read_bytes() == (reference / "config.json").read_bytes()
    assert (built / "tokenizer.json").is_file() and not (built / INDEX).exists()
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        derived_assets(reference, tmp_path / "empty", tmp_path / "x")


def test_fork_is_its_own_generation():
    assert titan_api.generation_of("0.2.2+neuron.1") == "spring2026-neuron"
    assert titan_api.generation_of("0.2.2+main.a9c5edc74") == "spring2026"
    assert titan_api.api_generation_of("spring2026-neuron") == "spring2026"
    assert titan_api.base_of("spring2026-neuron") == "spring2026" and titan_api.base_of("v0_3") is None
    assert titan_api.fork_note("0.2.2+neuron.1") is None
    assert "not a release the harness knows" in titan_api.fork_note("0.2.2+neuron.9")


FORK = dict(backend="hf_v5", size="full", init="pretrained", device="neuron",
            attention="causal", generation="spring2026-neuron")
NO_ADAPTER = "spring2026-hf_v5-no-hf-state-dict-adapter"


def test_the_fork_inherits_its_base_s_known_issues():
    on_main = known_issues.applicable("completed", **{**FORK, "generation": "spring2026"})
    assert [i.name for i in on_main] == [NO_ADAPTER]
    assert [i.name for i in known_issues.applicable("completed", **FORK)] == [NO_ADAPTER]
    assert known_issues.applicable("hf_save", backend="hf_v5", generation="spring2026-neuron"), (
        "the base's save defect would crash the fork's runs: they are launched without the save")
    assert not known_issues.applicable("completed", **{**FORK, "generation": "v0_3"})


def test_an_inherited_issue_that_reproduces_is_expected_and_named_inherited():
    verdict = known_issues.judge("completed", "the launcher exited with code 1",
                                 {"error": "AssertionError: ... but sd_adapter is not provided."}, **FORK)
    assert (verdict.status, verdict.inherited_from) == ("known", "spring2026"), verdict
    assert verdict.message.startswith("inherited from spring2026: known issue(s) " + NO_ADAPTER)


def test_a_fork_that_does_not_show_an_inherited_issue_passes_and_says_so():
    verdict = known_issues.judge("completed", None, {}, **FORK)
    assert (verdict.status, verdict.inherited_from) == ("pass", "spring2026"), verdict
    assert f"does not show known issue(s) {NO_ADAPTER} of spring2026" in verdict.message


def test_a_fork_failure_that_matches_no_inherited_signature_fails():
    verdict = known_issues.judge("completed", "the launcher exited with code 1",
                                 {"error": "RuntimeError: NRT init failed"}, **FORK)
    assert verdict.status == "fail" and "a different failure" in verdict.message, verdict


def test_fork_expectations_are_the_spring_api_s():
    for generation in ("spring2026", "spring2026-neuron"):
        moe = expected_loss("nki_moe", "qwen3_30b_a3b_4l_64e_top4", "random", "neuron",
                            "row_causal", generation=generation)
        assert moe.value == pytest.approx(12.418, abs=1e-3), "spring: trunc-normal dim^-0.5 cut at 3 std"
    v03 = expected_loss("nki_moe", "qwen3_30b_a3b_4l_64e_top4", "random", "neuron", "row_causal",
                        generation="v0_3")
    assert v03.value == pytest.approx(12.341, abs=1e-3)


def test_neuron_rank_env_strips_core_visibility_and_pins_auto_cast():
    inherited = {"NEURON_RT_VISIBLE_CORES": "0-63", "NEURON_RT_NUM_CORES": "64",
                 "NEURON_CC_FLAGS": "--auto-cast=matmult --optlevel 2"}
    env, unset, recorded = neuron_rank_env(inherited)
    assert set(unset) == set(NEURON_CORE_VISIBILITY)
    assert env["NEURON_CC_FLAGS"].split()[-1] == "--auto-cast=none", "ours last: it wins"
    assert "--optlevel" in env["NEURON_CC_FLAGS"]
    assert recorded["neuron-auto-cast"] == "none"
    assert "NEURON_RT_VISIBLE_CORES=0-63" in recorded["neuron-inherited-core-visibility"]
    profile = neuron_profile(64, inherited)
    assert profile.timeouts_s["tiny"] > 600 and profile.timeouts_s["full"] >= 100 * 60


def test_rank_environment_drops_inherited_core_visibility(monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0-63")
    env = rank_environment(RunSpec("titan_native"), neuron_profile(64, {}))
    assert "NEURON_RT_VISIBLE_CORES" not in env and env["NEURON_CC_FLAGS"] == "--auto-cast=none"


def test_the_data_a_run_reads_is_its_specs_and_its_command_names_it(tmp_path):
    c4 = RunSpec("titan_native", data="c4")  # no local copy: the Hub's repository
    command = build_command(c4, profile_for("cpu"), tmp_path)
    assert command[command.index("--dataloader.dataset") + 1] == c4.data == "c4"
    fixture = RunSpec("titan_native")
    assert fixture.data == "fixture"
    assert "--dataloader.dataset" not in build_command(fixture, profile_for("cpu"), tmp_path)


def test_independent_forward_tells_the_masks_apart():
    torch.manual_seed(0)
    tokens = torch.randint(0, 2048, (2, 256))
    positions = torch.cat([torch.arange(100), torch.arange(156)]).expand(2, -1)
    fed = Batch(tokens, None, torch.roll(tokens, -1, 1))
    batch = Batch(tokens, positions, fed.labels, fed=fed)
    losses = {m: independent_first_step_loss(paths.TINY_DENSE, [batch], m)
              for m in ("row_causal", "causal", "document")}
    band = loss_band("hf_forward_bf16").value
    assert abs(losses["causal"] - losses["document"]) > band, losses
    assert abs(losses["row_causal"] - losses["causal"]) > band, losses


def test_neuron_image_refuses_pypi_torchtitan():
    spec = importlib.util.spec_from_file_location("neuron_image", paths.REPO_ROOT / "constraints" / "neuron_image.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "not installed" in module.torchtitan_problem(None)
    assert "not a TorchTitan Neuron build" in module.torchtitan_problem("0.3.0")
    assert module.torchtitan_problem("0.2.2+neuron.1") is None


@pytest.mark.slow
def test_a_moe_saved_against_the_4b_index_fails_at_the_save(twin, tmp_path, backend_runs):
    """The first-night failure the MoE's own assets prevent: its HF save against a foreign
    index (the 4B's, as it once was given) stops the run with a KeyError on an MoE key."""
    foreign = derived_assets(paths.TINY_MOE, twin / DENSE_ASSETS, tmp_path / MOE_ASSETS)
    (foreign / INDEX).write_bytes((twin / DENSE_ASSETS / INDEX).read_bytes())
    run = backend_runs.get(RunSpec("nki_moe", size="full", init="random", steps=2, nproc=2,
                                   save_hf=True, hf_assets_path=str(foreign),
                                   overrides=(*FULL_OVERRIDES, *TWIN_OVERRIDES)))
    assert not run.ok, run.describe()
    assert not run.hf_checkpoint_dirs, run.hf_checkpoint_dirs
    logs = "".join(p.read_text(errors="replace") for files in run.rank_logs.values()
                   for p in files if p.exists())
    # The save fails on every rank (CheckpointException) with the MoE key the map lacks.
    assert re.search(r"KeyError: 'model\.layers\.\d+\.mlp\.(gate|experts)", logs), run.first_error()


def test_the_cli_builds_full_size_runs_as_the_run_template_does(twin):
    """`python3 -m harness run --profile full --assets-dir DIR` gives each backend its own
    assets folder under DIR (the MoE never the 4B folder), exactly the run template's spec."""
    args = argparse.Namespace(steps=2, workaround=[], backends=["titan_native", "nki_moe"],
                              inits=["random"], profile="full", assets_dir=str(twin))
    specs = {spec.backend: spec for spec in _specs(args, [], (), "cpu")}
    assert Path(specs["titan_native"].hf_assets_path) == twin / DENSE_ASSETS
    assert Path(specs["nki_moe"].hf_assets_path).name == MOE_ASSETS
    for backend, spec in specs.items():
        case = RunCase("cpu", backend, "full", "random", spec.attention)
        assert spec == case.run_spec(2, assets_root=str(twin))

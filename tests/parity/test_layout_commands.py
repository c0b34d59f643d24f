"""A layout's command line is the layout the registry names (harness/registry/layouts.py,
harness/launch/run.py ``layout_flags``), on every device.

Specification:
- a layout that compiles names the device's torch.compile backend: Inductor on CPU, TorchNeuron's
  "neuron" backend on trn2 (``DeviceProfile.compile_backend``), never torchtitan's default by
  omission;
- a full-size layout runs its own degrees on trn2 and its twin layout's on the CPU assets twin
  (``Layout.twin``), whose model is the tiny one; only a full-size run can be a twin's; the
  launch records the layout and the degrees its command ran (``RunResult.layout``,
  ``RunResult.degrees``, named as torchtitan names them), not the layout it was asked for;
- a full-size layout reads the FSDP run's rows only where every rank stays data-parallel (EP),
  and the layouts that recompute the MoE forward (the routing-count known issue's ``where``)
  are read off the registry;
- what a generation spells its own way (harness/upstream/titan_cli.py) is spelled for every
  API generation, each as its torchtitan takes it.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from harness.device.devices import neuron_profile, profile_for
from harness.launch import run as launcher
from harness.launch.run import RunSpec, build_command, layout_flags
from harness.launch.run_matrix import LayoutCase, RunCase
from harness.registry.assets_twin import build_twin
from harness.registry.generations import API_OF
from harness.registry.known_issues.native_qwen3 import RECOMPUTING_LAYOUTS
from harness.registry.layouts import LAYOUTS, layout
from harness.upstream import titan_cli

STEPS = 2


def _flag(command: list[str], name: str) -> str:
    assert command.count(name) == 1, f"{name} appears {command.count(name)} times in {command}"
    return command[command.index(name) + 1]


@pytest.mark.parametrize("profile, backend", [(profile_for("cpu"), "inductor"),
                                              (neuron_profile(64, {}), "neuron")],
                         ids=["cpu", "neuron"])
def test_a_compiling_layout_compiles_through_the_devices_backend(profile, backend, tmp_path):
    spec = LayoutCase(profile.kind, "titan_native", "compile").run_spec(STEPS)
    command = build_command(spec, profile, tmp_path)
    assert _flag(command, "--compile.backend") == backend
    assert _flag(command, "--compile.components") == "model,loss"
    fsdp = build_command(LayoutCase(profile.kind, "titan_native", "compile").fsdp_case().run_spec(STEPS),
                         profile, tmp_path)
    assert "--compile.enable" not in fsdp and "--compile.backend" not in fsdp


@pytest.mark.parametrize("name, flag, own, twin", [
    ("tp4+fsdp", "--parallelism.tensor_parallel_degree", "4", "2"),
    ("ep64", "--parallelism.expert_parallel_degree", "64", "2"),
])
def test_a_full_size_layout_runs_its_twins_degrees_on_the_assets_twin(name, flag, own, twin, twin_root,
                                                                       tmp_path):
    lay = layout(name)
    assert lay.full_size and LAYOUTS[lay.twin].ranks == 2
    backend = "titan_native" if lay.applies_to("dense") else "nki_moe"
    init = "pretrained" if backend == "titan_native" else "random"
    for device, profile, degree, ranks in (("neuron", neuron_profile(64, {}), own, 64),
                                           ("cpu", profile_for("cpu"), twin, 2)):
        case = RunCase(device, backend, "full", init, "sdpa", layout=name)
        spec = case.run_spec(STEPS, assets_root=str(twin_root), workdir=str(tmp_path))
        assert spec.twin == (device == "cpu")
        flags = list(layout_flags(spec, profile.compile_backend))
        assert _flag(flags, flag) == degree, (device, flags)
        assert "--training.local_batch_size" not in flags  # the size's own, as users run it
        assert spec.ranks(profile) == ranks


@pytest.mark.parametrize("name, ran, degree", [("tp4+fsdp", "tp", "tensor_parallel_degree"),
                                               ("ep64", "ep", "expert_parallel_degree")])
def test_an_assets_twin_run_records_the_layout_and_degrees_it_ran(name, ran, degree, twin_root, tmp_path,
                                                                 monkeypatch):

    backend = "titan_native" if layout(name).applies_to("dense") else "nki_moe"
    init = "pretrained" if backend == "titan_native" else "random"
    spec = replace(RunCase("cpu", backend, "full", init, "sdpa", layout=name).run_spec(
        STEPS, assets_root=str(twin_root), workdir=str(tmp_path)), start="cold")
    commands = []

    def no_ranks(spec, profile, run_dir):  # the launch as it is, its ranks left out
        commands.extend(launcher_commands(spec, profile, run_dir))
        return [[sys.executable, "-c", "pass"]]

    launcher_commands = launcher.node_commands
    monkeypatch.setattr(launcher, "node_commands", no_ranks)
    result = launcher.launch(spec, profile_for("cpu"), tmp_path / "run")
    assert result.ok and result.spec == spec and spec.layout == name, result.describe()
    assert (result.layout, result.where()["layout"]) == (ran, ran), result.describe()
    assert result.degrees == {
        "data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 2 if ran == "ep" else 1,
        "context_parallel_degree": 1, "tensor_parallel_degree": 2 if ran == "tp" else 1,
        "pipeline_parallel_degree": 1, "expert_parallel_degree": 2 if ran == "ep" else 1}
    (command,) = commands
    for flag, value in result.degrees.items():  # what the command says, where it says it
        if f"--parallelism.{flag}" in command:
            assert _flag(command, f"--parallelism.{flag}") == str(value), (flag, command)
    assert _flag(command, f"--parallelism.{degree}") == "2"


@pytest.fixture(scope="module")
def twin_root(tmp_path_factory):
    return build_twin(tmp_path_factory.mktemp("twin") / "twin")


def test_only_a_full_size_layout_run_can_be_the_twins():
    with pytest.raises(ValueError, match="twin=True runs a full-size code path"):
        RunSpec("titan_native", size="tiny", init="pretrained", twin=True)
    with pytest.raises(ValueError, match="names no twin layout"):
        RunSpec("titan_native", size="tiny", init="pretrained", layout="tp", twin=True)


def test_a_full_size_layout_reads_the_fsdp_runs_rows_only_where_every_rank_stays_data_parallel():
    assert layout("ep64").same_batches_as_fsdp  # EP borrows the FSDP ranks and keeps their rows
    assert not layout("tp4+fsdp").same_batches_as_fsdp  # 16 data-parallel ranks read 64's rows


def test_the_layouts_that_recompute_the_moe_forward_are_the_registrys():
    once = {name for name, lay in LAYOUTS.items() if name not in RECOMPUTING_LAYOUTS}
    assert once == {"ac=none", "compile"}, once
    assert {"fsdp", "ep", "ep64", "tp4+fsdp"} <= set(RECOMPUTING_LAYOUTS)


def test_every_api_generation_spells_a_layouts_own_flags():
    assert set(titan_cli.LAYOUT_OVERRIDES) == set(API_OF.values())
    ep_ac_full = {"tp": 1, "ep": 2, "pp": 1, "ac": "full", "vocab_size": 64}
    # 0.3.0: a tyro subcommand, last, and CUDA graphs off under EP; spring 2026: a field
    assert titan_cli.LAYOUT_OVERRIDES["v0_3"](**ep_ac_full) == ("--training.disable_cuda_graphs",
                                                                "activation_checkpoint:full")
    assert titan_cli.LAYOUT_OVERRIDES["spring2026"](**ep_ac_full) == ("--activation_checkpoint.mode", "full")

"""What every launched rank records about its run comes from one installer, which the launcher
controls (harness/rank/observers.py), at the paths of one layout (harness/registry/dump_layout.py).

Specification:
- config functions are pure, as torchtitan's are: calling every registered backend's config
  function (every size and attention variant) and the SFT config leaves torchtitan's Trainer as
  it was (but for the generation's own named upstream shims, which harness/upstream/titan_api applies in
  process where a config asks for what the installed generation lacks, e.g. "sdpa" on 0.3.0:
  each marks what it patches with its name);
- every run's ranks, on every device (trn2 included) and for a user's subject config alike,
  start with the boot folder first on their path and ``HARNESS_OBSERVERS`` naming every
  observer; ``spec.extra_env`` can still name fewer;
- the boot ``sitecustomize`` installs the observers it is told as torchtitan's trainer is
  imported, nothing when told none, refuses an unknown name with an error naming the known
  ones, and then runs the ``sitecustomize`` it shadows (a venv's or an image's own);
- installed on a trainer, the observers write every record at the layout's paths, the readers
  read back what the trainer had, and the trainer computes exactly what it computes without
  them (observing only); through torchtitan's real trainer (slow), a run logs bitwise the same
  losses and grad norms with and without them.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
from dataclasses import replace

import pytest
import torch
import torchtitan.trainer

from harness.backends import BACKENDS, sft_config
from harness.device.devices import detect, neuron_profile
from harness.launch.run import RunSpec, rank_environment
from harness.launch.run_matrix import RunCase
from harness.launch.subjects import Facts
from harness.rank import observers as rank_observers
from harness.references.batch import load_batches
from harness.registry import dump_layout, environment, paths
from harness.upstream import titan_api
from harness.upstream.install import SHIMS

# ------------------------------------------------------------------ config functions are pure

def registered_config_functions():
    for spec in BACKENDS.values():
        module = importlib.import_module(spec.module)
        for size in spec.sizes:
            for attention in spec.attention:
                yield f"{spec.module}.{spec.config_name(size, attention)}", getattr(
                    module, spec.config_name(size, attention))
    yield "harness.backends.sft_config.tiny_sft", sft_config.tiny_sft


def trainer_changes(config_function) -> list[str]:
    """What calling ``config_function`` changed of torchtitan's Trainer class, but for the
    patches of a named upstream shim."""
    cls = torchtitan.trainer.Trainer
    before = dict(vars(cls))
    config_function()
    after = dict(vars(cls))
    return sorted(name for name in before.keys() | after.keys() if before.get(name) is not after.get(name)
                  and getattr(after.get(name), "_harness_shim", None) not in SHIMS)


@pytest.mark.parametrize("name, function", list(registered_config_functions()),
                         ids=[name for name, _ in registered_config_functions()])
def test_config_functions_build_a_config_and_touch_nothing_else(name, function):
    changed = trainer_changes(function)
    assert not changed, f"{name}() changed torchtitan's Trainer: {changed}"


def test_the_purity_check_sees_a_config_function_that_patches_the_trainer():
    cls = torchtitan.trainer.Trainer
    original = cls.train

    def impure():
        cls.train = lambda self: original(self)

    try:
        assert trainer_changes(impure) == ["train"]
    finally:
        cls.train = original


# ------------------------------------------------------------------ the launcher installs them

def subject_spec() -> RunSpec:
    facts = Facts(module="user_configs", config="native_tiny", kind="titan_native",
                  model="tiny_dense", model_dir=paths.TINY_DENSE, assets_dir=paths.TINY_DENSE,
                  init="random", weights_dir=None, precision="float32", attention="sdpa",
                  mask="row_causal", parameters=1)
    return RunSpec.for_subject(facts)


@pytest.mark.parametrize("profile", [detect("cpu"), neuron_profile(64, {})], ids=["cpu", "trn2"])
@pytest.mark.parametrize("spec", [RunSpec("titan_native"), RunSpec("hf_v5", init="pretrained"),
                                  subject_spec()], ids=["backend", "pretrained", "subject"])
def test_every_rank_boots_with_every_observer_on_every_device(profile, spec):
    env = rank_environment(spec, profile)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(paths.BOOT_DIR)
    assert env[environment.OBSERVERS].split(",") == list(rank_observers.OBSERVERS)


def test_a_run_may_name_fewer_observers():
    spec = RunSpec("titan_native", extra_env=((environment.OBSERVERS, "batches"),))
    assert rank_environment(spec, detect("cpu"))[environment.OBSERVERS] == "batches"


# What a rank's boot leaves, without importing torch: the post-import hook on torchtitan's trainer.
BOOT = """
import sys
hooks = [f for f in sys.meta_path if getattr(f, "module_name", None) == "torchtitan.trainer"]
print(len(hooks), "torch" in sys.modules)
"""


def boot(extra_env: dict[str, str], code: str = BOOT, pythonpath: tuple[str, ...] = ()):
    # the boot folder first; no shims, no plants, no observers but those named in extra_env
    env = environment.child_environment(rank=True, **extra_env)
    env["PYTHONPATH"] = os.pathsep.join((env["PYTHONPATH"], *pythonpath))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_the_boot_installs_the_named_observers_as_the_trainer_is_imported():
    named = boot({environment.OBSERVERS: rank_observers.env_value()})
    assert named.returncode == 0, named.stderr[-2000:]
    assert named.stdout.split() == ["1", "False"]  # one hook, and torch not imported yet
    none = boot({})
    assert none.returncode == 0, none.stderr[-2000:]
    assert none.stdout.split() == ["0", "False"]


def test_the_boot_refuses_an_unknown_observer_naming_the_known_ones():
    done = boot({environment.OBSERVERS: "batches,step0_batch"})
    assert done.returncode != 0
    assert "unknown rank observer(s) ['step0_batch']" in done.stderr
    assert all(name in done.stderr for name in rank_observers.OBSERVERS)


def test_the_boot_runs_the_sitecustomize_it_shadows(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_RAN = True\n")
    code = "import builtins; print(getattr(builtins, 'SHADOWED_RAN', False))"
    done = boot({environment.OBSERVERS: "batches"}, code, pythonpath=(str(tmp_path),))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"


# ------------------------------------------------------------------ what they record, observing only

STEPS, MICROBATCHES = 2, 2


class TiedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(8, 4)
        self.layers = torch.nn.ModuleDict({"0": torch.nn.Linear(4, 4)})
        self.lm_head = torch.nn.Linear(4, 8, bias=False)
        self.lm_head.weight = self.tok_embeddings.weight
        self.enable_weight_tying = True


def stand_in_trainer_module(dump: str):
    """What the observers touch of torchtitan's Trainer, training ``STEPS`` steps of
    ``MICROBATCHES`` microbatches; ``fed`` keeps what the model would be fed."""

    class Trainer:
        def __init__(self):
            torch.manual_seed(0)
            self.config = types.SimpleNamespace(dump_folder=dump,
                                                checkpoint=types.SimpleNamespace(initial_load_path=None))
            self.model_parts = [TiedModel()]
            self.step = 0
            self.checkpointer = types.SimpleNamespace(load=lambda step=-1: False)
            self.optimizers = types.SimpleNamespace(step=lambda: None)
            self.fed = []

        def post_dataloading_process(self, input_dict, labels):
            extra = {"positions": input_dict["positions"]}
            if titan_api.api_generation() == "v0_3":
                return input_dict["input"] * 2, labels, extra
            return input_dict["input"] * 2, labels, {}, extra

        gradient_accumulation_steps = MICROBATCHES

        def forward_backward_step(self, *, input_dict, labels):
            processed = self.post_dataloading_process(input_dict, labels)
            self.fed.append(processed)
            model = self.model_parts[0]
            loss = model.lm_head(model.tok_embeddings(titan_api.post_dataloading_parts(processed)[0] % 8)).sum()
            loss.backward()
            return loss

        def train(self):
            self.checkpointer.load(step=0)
            generator = torch.Generator().manual_seed(1)
            for self.step in range(1, STEPS + 1):
                self.model_parts[0].zero_grad()
                for _ in range(MICROBATCHES):
                    tokens = torch.randint(0, 8, (2, 6), generator=generator)
                    batch = {"input": tokens, "positions": torch.arange(6).expand(2, 6)}
                    self.forward_backward_step(input_dict=batch, labels=tokens.roll(-1, dims=1))
                if self.step == 1:
                    self.first_grads = {n: p.grad.clone() for n, p in self.model_parts[0].named_parameters()
                                        if p.grad is not None}
                self.optimizers.step()

    return types.SimpleNamespace(Trainer=Trainer)


def trained(tmp_path, names, monkeypatch, dump_steps=1):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv(environment.DUMP_STEPS, str(dump_steps))
    module = stand_in_trainer_module(str(dump_layout.dump_folder(tmp_path)))
    if names is not None:
        rank_observers.install(module, names)
    trainer = module.Trainer()
    trainer.train()
    return trainer


def fed(trainer) -> list[torch.Tensor]:
    return [t for processed in trainer.fed for t in titan_api.post_dataloading_parts(processed)[:2]]


def test_the_observers_record_at_the_layouts_paths_and_change_nothing(tmp_path, monkeypatch):
    observed = trained(tmp_path / "observed", rank_observers.OBSERVERS, monkeypatch, dump_steps=2)
    bare = trained(tmp_path / "bare", None, monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(fed(observed), fed(bare), strict=True))
    model = observed.model_parts[0]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), bare.model_parts[0].parameters(), strict=True))

    run_dir = tmp_path / "observed"
    initial = dump_layout.initial_native_state(dump_layout.initial_weights_dir(run_dir))
    assert sorted(initial) == sorted(model.state_dict())
    assert all(torch.equal(initial[k], v) for k, v in model.state_dict().items())
    fingerprints = dump_layout.read_fingerprints(run_dir)
    assert list(fingerprints) == [0] and fingerprints[0]["step"] == 1
    assert sorted(fingerprints[0]["params"]) == sorted(n for n, _ in model.named_parameters())
    for step in (1, 2):  # a step's dump holds every microbatch's rows, in feeding order
        (batch,) = load_batches(run_dir, step)
        microbatches = observed.fed[(step - 1) * MICROBATCHES:step * MICROBATCHES]
        assert torch.equal(batch.fed.inputs,
                           torch.cat([titan_api.post_dataloading_parts(m)[0] for m in microbatches]))
        assert torch.equal(batch.inputs * 2, batch.fed.inputs)
    records = dump_layout.rank_state_records(run_dir)
    assert sorted(records[0]) == ["built", "loaded", "trained"]
    assert all(records[0][phase]["parts"][0]["tied_same_parameter"] for phase in records[0])
    # the first step's gradients after its last microbatch, as the trainer held them
    grads = dump_layout.grad_records(run_dir)[0]
    assert grads["step"] == 1 and sorted(grads["grads"]) == sorted(observed.first_grads)
    assert all(torch.equal(grads["grads"][n][0], g) for n, g in observed.first_grads.items())
    assert dump_layout.resumed_state_records(run_dir) == {}  # nothing was resumed


def test_the_observers_record_only_the_steps_and_observers_they_are_told(tmp_path, monkeypatch):
    trained(tmp_path / "batches", ("batches",), monkeypatch)
    run_dir = tmp_path / "batches"
    assert len(load_batches(run_dir, 1)) == 1
    with pytest.raises(FileNotFoundError, match="no batch dumps of step 2"):
        load_batches(run_dir, 2)
    assert dump_layout.initial_weights_dir(run_dir) is None
    assert dump_layout.read_fingerprints(run_dir) is None
    assert dump_layout.rank_state_records(run_dir) == {}
    with pytest.raises(ValueError, match="unknown rank observer"):
        rank_observers.install(stand_in_trainer_module(str(run_dir)), ("batch",))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["titan_native", "nki_moe"])
def test_a_run_logs_the_same_losses_and_grad_norms_without_its_observers(device_runs, steps,
                                                                       workarounds, backend):
    """Observing only, through torchtitan's real trainer: the run template's CPU random-init run
    (every observer; nki_moe's carries the load-balancing hooks and its checkpoints) and the
    same run with none log bitwise the same losses and grad norms."""
    case = RunCase("cpu", backend, "tiny", "random", BACKENDS[backend].default_attention)
    spec = case.suite_spec(steps, workarounds=workarounds)
    observed = device_runs("cpu").get(spec)
    bare = device_runs("cpu").get(replace(spec, extra_env=(*spec.extra_env,
                                                           (environment.OBSERVERS, ""))))
    assert observed.ok and bare.ok, f"see {observed.run_dir} and {bare.run_dir}"
    assert dump_layout.read_fingerprints(observed.run_dir) is not None
    assert dump_layout.read_fingerprints(bare.run_dir) is None, "the bare run was observed"
    assert [(s.step, s.loss, s.grad_norm) for s in bare.steps] == \
        [(s.step, s.loss, s.grad_norm) for s in observed.steps]

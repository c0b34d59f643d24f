"""The diagnosis of a failing first step (harness/diagnosis).

Specification:
- the run's model (built as the trainer builds it, with the run's plants) is compared module by
  module with the float64 reference trace on the run's first batch and starting weights; the
  first module beyond the diagnosis tolerance is named, and no earlier one;
- that model is built on the meta device and run one unit at a time, at every size (so these
  tests walk the path a full-size run walks): it computes what the whole model computes, and
  never holds more than its largest unit's parameters;
- shown on defects the diagnosis was not written for, each acting in one place: a q/k-norm
  swap in layer 1 only, a RoPE theta change, two experts swapped in one MoE layer, the final
  RMSNorm's eps; a clean model has no divergent module;
- then the run's loss (summed cross entropy over the valid labels) is backwarded through both,
  and every module's output and parameter gradients are compared in backward order: a defect
  that leaves the forward exact and breaks only a backward is named, as a gradient;
- torchtitan's transformers backend (hf_v5) is diagnosed under transformers' module names,
  with the run's own workarounds and masking: a clean one has no divergent module, and each of
  its known defects the run did not work around is named as that known issue; a plant in one
  of its modules is named; the native MoE's known unloaded experts (spring) likewise;
- hints by signature: a pretrained run at the random-init loss did not load its weights (the
  directory it read is named); a deviation that fits a known issue recorded elsewhere "looks
  like" it; no signature that fits, no hint;
- a launched run with a plant writes a summary.md whose failing check names the module; a
  random-init run is diagnosed from the step-0 weights and first batch its ranks dumped (slow).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.checks import run_checks as checks
from harness.device.devices import detect
from harness.diagnosis import diagnose, hints, localize, subject
from harness.diagnosis.__main__ import localize_request
from harness.diagnosis.diagnose import Diagnosis, first_nonfinite_after_step_1, known_explanation
from harness.launch.run import RunSpec, launch
from harness.parity.conformance.native_to_hf import module_of_weight
from harness.references import model as reference
from harness.references.expected_loss import analytic_random_init_loss, configured_lm_head_std
from harness.references.loss import avg_loss
from harness.references.model import trace_names
from harness.registry import paths
from harness.registry.hf_config import Qwen3Arch
from harness.registry.tolerances import diagnosis_tolerance
from harness.report.run_report import RunVerdict, write_report
from harness.results.run_result import RunResult, StepRecord
from harness.upstream.titan_api import generation

DENSE = ("titan_native", "sdpa", paths.TINY_DENSE, "float32")
MOE = ("nki_moe", "sdpa", paths.TINY_MOE, "bf16_experts")
# The routed experts' module: 0.3.0's MoE.routed_experts is spring-2026 main's MoE.experts; the
# diagnosis reports the model's own name (localize.ALIASES).
EXPERTS = "experts" if generation() == "spring2026" else "routed_experts"
# Spring's HF adapter leaves the experts at their init (known issue): the diagnosis names it
# and looks past it.
EXPERTS_NOT_LOADED = "spring2026-qwen3-moe-adapter-expert-keys"

HF_V5 = ("hf_v5", "sdpa", paths.TINY_DENSE, "float32")
# The transformers backend's known defects, each named where the run did not work it around:
# RoPE inv_freq left uninitialised (workaround hf_rope_init), and its mask (0.3.0: causal
# across documents at per-document positions, worked around by hf_block_causal; spring: causal
# over the row at row positions, no workaround).
HF_ROPE = "hf_v5-rope-inv-freq-uninitialised"
HF_MASK = ("spring2026-hf_v5-row-positions" if generation() == "spring2026"
           else "hf_v5-causal-mask-across-documents")
HF_WORKAROUNDS = ("hf_rope_init",) + (() if generation() == "spring2026" else ("hf_block_causal",))


def diagnose_in_process(build, plants=(), tmp_path=None, workarounds=()):
    backend, attention, model_dir, regime = build
    result = localize_request({
        "backend": backend, "attention": attention, "model_dir": str(model_dir),
        "weights_dir": str(model_dir), "run_dir": str(tmp_path), "nproc": 2, "device": "cpu",
        "plants": list(plants), "regime": regime, "workarounds": list(workarounds)})
    assert result["not_diagnosed"] is None, result
    memory = result["divergence"]["memory"]["model"]  # the model under test, one unit at a time
    assert memory["peak_live_parameter_bytes"] == memory["largest_unit_parameter_bytes"], memory
    return result["divergence"]


@pytest.mark.parametrize("build", [DENSE, MOE],
                         ids=["titan_native", "nki_moe"])
def test_a_clean_model_has_no_divergent_module(build, tmp_path):
    found = diagnose_in_process(build, tmp_path=tmp_path)
    assert found["module"] is None, "\n".join(found["table"])
    assert found["compared"] > 10  # every module of the tiny model, not an empty walk
    if build is MOE:  # the routed experts' weight gradients, per expert, in both generations
        experts = [line for line in found["table"] if ".mlp.experts." in line]
        assert len(experts) > 3 * 16, "\n".join(found["table"])  # most of 2 x 16 experts x 3
    known = " ".join(found["known"])
    if build is MOE and generation() == "spring2026":
        assert f"known issue {EXPERTS_NOT_LOADED}" in known, found
    else:
        assert known == "", found


PLANTED = [  # plant, the model it is planted in, the module the diagnosis must name
    ("qk_norm_swap_layer1", DENSE, "layers.1.attention.q_norm"),
    ("rope_theta_x10", DENSE, "layers.0.attention.rope"),
    ("swap_experts_layer1", MOE, f"layers.1.moe.{EXPERTS}"),
    ("final_norm_eps", DENSE, "norm"),
]


@pytest.mark.parametrize("plant,build,module", PLANTED,
                         ids=["qk_norm_swap_layer1", "rope_theta_x10", "swap_experts_layer1",
                              "final_norm_eps"])
def test_the_diagnosis_names_the_planted_module(plant, build, module, tmp_path):
    found = diagnose_in_process(build, (plant,), tmp_path)
    table = "\n".join(found["table"])
    assert found["module"] == module, f"{found['line']}\n{table}"
    assert found["kind"] == "activation", found["line"]
    tolerance = diagnosis_tolerance("activations", build[3]).rtol
    assert found["before_max_rel"] < tolerance, table  # everything before it agreed


@pytest.mark.parametrize("workarounds", [(), HF_WORKAROUNDS], ids=["as_launched", "worked_around"])
def test_a_clean_transformers_backend_has_no_divergent_module_and_its_known_defects_are_named(
        workarounds, tmp_path):
    found = diagnose_in_process(HF_V5, tmp_path=tmp_path, workarounds=workarounds)
    assert found["module"] is None, "\n".join(found["table"])
    assert found["compared"] > 40  # outputs and gradients of every HF module the trace names
    known = " ".join(found["known"])
    assert (f"known issue {HF_ROPE}" in known) == ("hf_rope_init" not in workarounds), known
    masked_per_document = "hf_block_causal" in workarounds
    assert (f"known issue {HF_MASK}" in known) == (not masked_per_document), known


def test_a_plant_in_a_transformers_backend_module_is_named_by_its_hf_name(tmp_path):
    found = diagnose_in_process(HF_V5, ("hf_qk_norm_swap_layer1",), tmp_path)
    table = "\n".join(found["table"])
    assert found["module"] == "model.layers.1.self_attn.q_norm", f"{found['line']}\n{table}"
    assert found["before_max_rel"] < diagnosis_tolerance("activations", "float32").rtol, table


@pytest.mark.parametrize("build", [DENSE, MOE], ids=["titan_native", "nki_moe"])
def test_a_backward_only_defect_is_named_by_the_gradient_comparison(build, tmp_path):
    """The forward is exact (every output within the activation tolerance); layer 1's ffn_norm
    backward scales its incoming gradient: its weight's gradient is the first to part, in
    backward order, and the diagnosis says it is a gradient."""
    found = diagnose_in_process(build, ("ffn_norm_backward_layer1",), tmp_path)
    table = "\n".join(found["table"])
    assert found["module"] == "layers.1.ffn_norm", f"{found['line']}\n{table}"
    assert found["kind"] == "gradient" and "gradient" in found["line"], found["line"]
    assert "post_attention_layernorm" in found["quantity"], found["line"]
    assert found["before_max_rel"] < diagnosis_tolerance("gradients", build[3]).rtol, table


@pytest.mark.parametrize("build", [DENSE, MOE], ids=["titan_native", "nki_moe"])
def test_a_backward_defect_in_a_units_input_gradient_is_named_at_that_unit(build, tmp_path):
    """Layer 1's attention_norm computes its output and weight gradient exactly and scales only
    the gradient it sends to its input: every output and parameter gradient of layer 1 agrees,
    and the layer's input gradient is the first to part, named at layer 1 (not at layer 0,
    whose output gradient it is)."""
    found = diagnose_in_process(build, ("attention_norm_input_backward_layer1",), tmp_path)
    table = "\n".join(found["table"])
    assert found["module"] == "layers.1", f"{found['line']}\n{table}"
    assert found["kind"] == "gradient" and found["quantity"] == "layers.1 (input)", found["line"]
    assert found["before_max_rel"] < diagnosis_tolerance("gradients", build[3]).rtol, table


def test_a_transformers_backend_moe_is_not_diagnosed_and_says_why(tmp_path):
    result = localize_request({
        "backend": "hf_v5", "attention": "sdpa", "model_dir": str(paths.TINY_MOE),
        "weights_dir": str(paths.TINY_MOE), "run_dir": str(tmp_path), "nproc": 2,
        "device": "cpu", "regime": "bf16_experts"})
    assert result["divergence"] is None, result["divergence"]
    assert "the transformers backend's MoE" in result["not_diagnosed"], result
    assert "build_and_swap_native_moe" in result["not_diagnosed"], result


def test_random_init_loss_of_a_pretrained_run_says_the_weights_did_not_load():
    vocab, hidden, std = 2048, 128, 0.02
    analytic = math.log(vocab) + std**2 * hidden / 2
    hint = hints.random_init_hint(analytic + 0.03, vocab, hidden, std, "/assets/Qwen3")
    assert hint and "the weights did not load: check --assets-dir" in hint
    assert "/assets/Qwen3" in hint and f"{analytic:.4f}" in hint
    assert hints.random_init_hint(analytic - 1.0, vocab, hidden, std, "/assets/Qwen3") is None


def test_a_known_issue_recorded_elsewhere_is_named_only_when_its_signature_fits():
    # tiny random-init transformers backend, recorded +3.6 nats; asked from native Qwen3
    here = {"backend": "titan_native", "size": "tiny", "init": "random", "device": "cpu",
            "attention": "sdpa", "generation": "v0_3"}
    fits = hints.known_issue_hints(3.6, here)
    assert any(h.startswith("looks like hf_v5-tied-embedding-init-scale") for h in fits), fits
    assert hints.known_issue_hints(0.0123, here) == []


@pytest.mark.slow
def test_a_launched_run_with_a_plant_names_its_module_in_summary_md(tmp_path):
    spec = RunSpec(backend="titan_native", size="tiny", init="pretrained", steps=2,
                   plants=("qk_norm_swap_layer1",))
    run = launch(spec, detect("cpu"), tmp_path / "runs" / "planted")
    write_report([RunVerdict(run, checks.verdicts(run, 2))], tmp_path, {"device": "cpu"})
    summary = (tmp_path / "summary.md").read_text()
    assert "first_step_loss: FAIL" in summary
    assert "first divergent module: layers.1.attention.q_norm" in summary, summary


@pytest.mark.slow
def test_a_random_init_run_is_diagnosed_from_the_weights_its_ranks_dumped(tmp_path):
    spec = RunSpec(backend="titan_native", size="tiny", init="random", steps=1,
                   plants=("qk_norm_swap_layer1",))
    run = launch(spec, detect("cpu"), tmp_path / "runs" / "random")
    found = diagnose.diagnose(run)
    assert found.module == "layers.1.attention.q_norm", found.lines()
    assert "step-0 weights" in found.divergence["weights_from"]
    assert found.divergence["batch_from"] == "rank 0's dump"


def _pretrained_result(loss, tmp_path):
    step = StepRecord(step=1, loss=loss, grad_norm=1.0, tokens_per_s=1.0, step_time_s=1.0,
                      peak_memory_gib=1.0)
    spec = RunSpec("titan_native", init="pretrained")
    assert spec.model_dir() == spec.weights_dir() == paths.TINY_DENSE
    return RunResult(spec=spec, device="cpu", nproc=2, layout="fsdp", degrees=spec.parallel_degrees(2),
                     command=[], returncode=0, timed_out=False, duration_s=1.0, run_dir=tmp_path,
                     steps=[step], versions={"torchtitan-generation": generation()})


def test_a_pretrained_run_at_its_random_init_loss_is_told_to_check_its_assets(tmp_path):
    arch = Qwen3Arch.from_dir(paths.TINY_DENSE)
    analytic = analytic_random_init_loss(arch.vocab_size, arch.hidden_size,
                                         configured_lm_head_std("titan_native", arch.hidden_size))
    unloaded = hints.hints_for(_pretrained_result(analytic + 0.02, tmp_path), analytic + 0.02, 6.4)
    assert any("check --assets-dir" in h and str(paths.TINY_DENSE) in h for h in unloaded), unloaded
    # a failure near the expectation fits no signature: nothing is said
    assert hints.hints_for(_pretrained_result(1.2752, tmp_path), 1.2752, 7.7e-4) == []


def test_a_later_non_finite_step_is_said_to_arise_after_what_step_1_replays(tmp_path):
    """The ``finite`` check fails at step 3: the diagnosis replays step 1 (forward and
    backward); when they agree, it says the NaN arose after the first optimizer step."""
    run = _pretrained_result(1.2752, tmp_path)
    assert first_nonfinite_after_step_1(run) is None
    run.steps += [StepRecord(step=2, loss=1.1, grad_norm=1.0, tokens_per_s=1.0, step_time_s=1.0,
                             peak_memory_gib=1.0),
                  StepRecord(step=3, loss=float("nan"), grad_norm=float("inf"), tokens_per_s=1.0,
                             step_time_s=1.0, peak_memory_gib=1.0)]
    assert first_nonfinite_after_step_1(run) == 3
    clean = {"module": None, "line": "no module parts from the reference", "known": []}
    said = Diagnosis(divergence=clean, later_nonfinite=3).lines()
    assert any("step 3 went non-finite" in line for line in said), said
    named = Diagnosis(divergence={**clean, "module": "norm", "line": "norm: ..."}, later_nonfinite=3)
    assert not any("non-finite" in line for line in named.lines())  # the module is the answer


def test_a_step_1_loss_that_is_a_known_issue_here_is_named_without_a_module_walk(tmp_path):
    """A tiny random-init transformers-backend run +3.6 nats off is the recorded signature of
    hf_v5-tied-embedding-init-scale: the diagnosis says so and rebuilds nothing; 0.5 nats off
    is not that issue, and is diagnosed."""
    run = dataclasses.replace(_pretrained_result(11.8, tmp_path), spec=RunSpec("hf_v5", init="random"))
    assert known_explanation(run, 3.6) == "hf_v5-tied-embedding-init-scale"
    assert known_explanation(run, 0.5) is None
    assert known_explanation(run, None) is None  # a finite failure: always diagnosed
    said = Diagnosis(explained_by="hf_v5-tied-embedding-init-scale").lines()
    assert said == ["diagnosis: the step-1 loss is known issue hf_v5-tied-embedding-init-scale's "
                    "recorded signature here, so no module walk was run"]


# Measured, streamed vs whole model, on CPU: every forward output of all three backends in
# both generations, and every gradient of titan_native and hf_v5 in both and of nki_moe on
# v0_3, is bitwise equal. On spring2026's tiny MoE, up to three gradients inside layer 0 (its
# ffn_norm and attention output gradients, its o_proj weight gradient) differ by 0 to 8 ulps,
# varying from run to run, though the gradient layer 0 receives is bitwise equal: spring's MoE
# backward is not bitwise reproducible on CPU here (cause not pinned down further). The bound
# is the largest measured, nothing looser.
STREAMED_GRADIENT_ULPS = 8


def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| in units in the last place of the larger of the two."""
    scale = torch.maximum(a.abs(), b.abs()).clamp_min(torch.finfo(a.dtype).tiny)
    spacing = torch.finfo(a.dtype).eps * torch.exp2(torch.floor(torch.log2(scale)))
    return ((a - b).abs() / spacing).max().item()


def _recorded(built):
    """Every module output, output gradient and HF parameter gradient of the model under test
    on the run's first batch: the whole model in one forward and one backward, or the
    streamed one as it hands them to the diagnosis, unit by unit (a tied weight's gradient
    summed over its uses)."""
    modules = built.modules if built.modules is not None else localize.native_modules(
        built.module, [n for n, _ in trace_names(built.arch)])
    if built.under_test is None:
        with localize.Recorder(modules, grads=True) as recorder, torch.enable_grad():
            logits = built.run()
        avg_loss(logits, built.labels).backward()
        outputs, out_grads, param_grads = recorder.take(), recorder.out_grads, built.model_grads()
    else:
        outputs, out_grads, param_grads = {}, {}, {}

        def backward_visit(_unit, grads, params, _input_grad):
            for key, slots in grads.items():
                out_grads.setdefault(key, {}).update(slots)
            for key, g in params.items():
                param_grads[key] = param_grads[key] + g if key in param_grads else g

        built.under_test.forward(modules, lambda _unit, got: outputs.update(got))
        built.under_test.backward(modules, built.labels, backward_visit)
    flat = {f"{k}[{i}]": t for k, ts in outputs.items() for i, t in enumerate(ts)}
    flat |= {f"∇ {k}[{i}]": t for k, slots in out_grads.items() for i, t in slots.items()}
    flat |= {f"∇ {k}": t for k, t in param_grads.items()}
    return flat, built.under_test


@pytest.mark.parametrize("build", [DENSE, MOE, HF_V5], ids=["titan_native", "nki_moe", "hf_v5"])
def test_the_streamed_model_computes_bitwise_what_the_whole_model_computes(build, tmp_path):
    """One unit in memory at a time (meta build, per-unit load through the trainer's adapter,
    per-unit recomputed backward) gives the whole model's outputs and gradients, bit for bit,
    and never holds more than its largest unit's parameters."""
    backend, attention, model_dir, regime = build
    recorded = {}
    for stream in (False, True):
        built, stack = subject.build(backend, attention, model_dir, model_dir, tmp_path, 2,
                                     regime=regime, stream=stream)
        with stack:
            recorded[stream] = _recorded(built)
    (whole, _), (streamed, runner) = recorded[False], recorded[True]
    assert sorted(streamed) == sorted(whole), (sorted(set(streamed) - set(whole)), sorted(set(whole) - set(streamed)))
    assert len(whole) > 40  # outputs and gradients of every module, not an empty record
    differ = {k: _ulps(whole[k], streamed[k].reshape(whole[k].shape)) for k in whole
              if not torch.equal(whole[k], streamed[k].reshape(whole[k].shape))}
    print(f"{backend}: {len(whole)} tensors, {len(differ)} not bitwise: {differ}")
    assert not [k for k in differ if not k.startswith("∇")], differ  # forward: bit for bit
    assert max(differ.values(), default=0) <= STREAMED_GRADIENT_ULPS, differ
    memory = runner.memory()
    assert memory["peak_live_parameter_bytes"] == memory["largest_unit_parameter_bytes"], memory
    assert memory["largest_unit_parameter_bytes"] < memory["model_parameter_bytes"] / 2, memory


def _deeper_dense(layers: int, into):
    """The tiny dense fixture with ``layers`` decoder layers, same width: layer i is the
    fixture's layer i % 2, every other tensor (embedding, final norm) the fixture's own."""
    into.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(paths.TINY_DENSE / name, into / name)
    config = json.loads((paths.TINY_DENSE / "config.json").read_text())
    kept = config["num_hidden_layers"]
    config["num_hidden_layers"], config["layer_types"] = layers, [config["layer_types"][0]] * layers
    (into / "config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(paths.TINY_DENSE / "model.safetensors")
    deeper = {k: t for k, t in tensors.items() if not k.startswith("model.layers.")}
    for i in range(layers):
        prefix = f"model.layers.{i % kept}."
        deeper |= {f"model.layers.{i}." + k[len(prefix):]: t.clone()
                   for k, t in tensors.items() if k.startswith(prefix)}
    save_file(deeper, into / "model.safetensors")
    return into


def _reference_memory(model_dir, tmp_path):
    found = diagnose_in_process(("titan_native", "sdpa", model_dir, "float32"), tmp_path=tmp_path)
    assert found["module"] is None and found["gradient_before"], found["line"]  # walked to the end
    return found["memory"]["reference"]


def _beyond_inputs(memory: dict) -> int:
    """The reference's peak besides the unit inputs it keeps for the backward."""
    return memory["peak_live_bytes"] - memory["saved_input_bytes"]


def _first_steps_moved(model_dir) -> dict[str, str]:
    """For each HF weight of ``model_dir`` (one routed expert per MoE layer), the first step of
    the float64 reference whose output moves when that weight alone is scaled by 1.5: each unit
    that reads it (``unit_weight_names``) run on its clean input, in forward order."""
    arch, source = Qwen3Arch.from_dir(model_dir), reference.WeightSource(model_dir)
    weights = {k: source[k] for k in source.keys()}
    tokens = torch.randint(0, arch.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    walk = reference.Reference(arch, tokens, torch.arange(16)[None])
    clean, x = {}, tokens
    for unit in reference.unit_names(arch):
        clean[unit] = (x, list(walk.unit(unit, weights, x)))
        x = clean[unit][1][-1][1]
    routed = {name: int(ids[0, 0]) for _, steps in clean.values() for name, (ids, _) in
              ((n, o) for n, o in steps if n.endswith(".moe.router"))}
    moved = {}
    for unit, (x, steps) in clean.items():
        for key in reference.unit_weight_names(arch, unit, set(weights)):
            expert = key.split(".experts.")[-1].split(".")[0] if ".experts." in key else None
            if key in moved or expert is not None and int(expert) != routed[f"{unit}.moe.router"]:
                continue  # a tied weight is its first reader's
            again = walk.unit(unit, {**weights, key: weights[key] * 1.5}, x)
            moved[key] = next(name for (name, a), (_, b) in zip(steps, again, strict=True) if not _same(a, b))
    return moved


def _same(a, b) -> bool:
    pair = (a, b) if isinstance(a, tuple) else ((a,), (b,))
    return all(torch.equal(u, v) for u, v in zip(*pair, strict=True))


@pytest.mark.parametrize("model_dir", [paths.TINY_DENSE, paths.TINY_MOE], ids=["dense", "moe"])
def test_each_gradient_is_filed_under_the_reference_step_that_reads_its_weight(model_dir):
    """The diagnosis files an HF weight's gradient under the module the one HF <-> native name
    table gives it (harness/parity/conformance/native_to_hf.py ``module_of_weight``): the first step of
    the reference whose output moves when only that weight moves. A table that files q_norm's
    weight under k_norm is caught."""
    moved = _first_steps_moved(model_dir)
    assert len(moved) > 20, moved
    assert {k: (module_of_weight(k), s) for k, s in moved.items() if module_of_weight(k) != s} == {}
    planted = {k: s for k, s in moved.items() if "q_norm" in k}
    assert planted and all(s != module_of_weight(k).replace("q_norm", "k_norm") for k, s in planted.items())


def test_the_reference_side_holds_one_unit_at_a_time_at_any_depth(tmp_path, monkeypatch):
    """The comparison runs the float64 reference unit by unit beside the model under test
    (forward, then backward from the loss): what it holds at its peak, besides the one input
    per unit it keeps for the backward, is one unit's weights, outputs and graph, the same for
    2 decoder layers as for 8; the unit inputs grow by one activation per layer. A walk that
    keeps every unit's module outputs (as a whole-model record does) grows with depth and is
    caught by the same measure."""
    shallow = _reference_memory(paths.TINY_DENSE, tmp_path)
    deep_dir = _deeper_dense(8, tmp_path / "deep")
    deep = _reference_memory(deep_dir, tmp_path)
    print(f"2 layers: {shallow}\n8 layers: {deep}")
    assert deep["model_weight_bytes"] > 2 * shallow["model_weight_bytes"], deep  # really deeper
    # the inputs kept: the token ids (int64) and one float64 hidden state per unit after the
    # embedding (2 + 2 layers: 4; 8 + 2: 10), 128 wide: the ids are 1/128 of a hidden state
    grown = deep["saved_input_bytes"] - shallow["saved_input_bytes"]
    hidden_state = grown // 6
    assert grown == 6 * hidden_state, (shallow, deep)
    assert shallow["saved_input_bytes"] == 4 * hidden_state + hidden_state // 128, shallow
    assert _beyond_inputs(deep) == _beyond_inputs(shallow), (shallow, deep)
    assert deep["largest_unit_weight_bytes"] == shallow["largest_unit_weight_bytes"]

    kept = []
    unit = reference.Reference.unit

    def keeping_every_output(self, name, w, x):
        for step in unit(self, name, w, x):
            kept.append(step)
            yield step

    monkeypatch.setattr(reference.Reference, "unit", keeping_every_output)
    keeping = _reference_memory(deep_dir, tmp_path)
    print(f"8 layers, every module output kept: {keeping}")
    assert _beyond_inputs(keeping) > 2 * _beyond_inputs(shallow), keeping

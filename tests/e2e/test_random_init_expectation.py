"""A random-init run's step 1 is held to the weights it really started from.

Specification (harness/checks/reference_forward.py ``initial_weights_forward``):
- a CPU random-init run whose ranks dumped its step-0 weights is held to the independent
  float32 HF forward of exactly those weights on every rank's own step-1 batch, in the band of
  its precision, and those weights to ln V + s^2/2 in the draw band;
- the same run paired with weights it did not start from (another draw of the same init, which
  ln V + s^2/2 cannot tell apart) fails, and so does a step-1 loss just outside the band;
- the registry (harness/registry/expectations.py) computes none of it: it states the rule (the
  analytic std rule, that the step-0 weights' forward comes first), and the checks hold the run
  to what their forwards compute (harness/checks/reference_forward.py ``expectation_for_run``);
- (slow) a run whose forward is planted wrong (RoPE theta x10, a defect ln V + s^2/2 cannot see
  at random init) fails.
The default-tier tests reuse the default suite's own random-init runs (no launch of their own).
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch

from harness.backends import BACKENDS
from harness.checks import reference_forward
from harness.checks.reference_forward import expectation_for_run
from harness.launch.run import RunSpec
from harness.launch.run_matrix import RunCase
from harness.registry import dump_layout
from harness.registry.expectations import ExpectationRegistry, MissingExpectation
from harness.registry.tolerances import initial_weights_forward_band


def _suite_run(backend, device_runs, steps, workarounds):
    """The default suite's ``cpu-<backend>-tiny-random`` run (the same RunSpec: one launch)."""
    case = RunCase("cpu", backend, "tiny", "random", BACKENDS[backend].default_attention)
    return device_runs("cpu").get(case.suite_spec(steps, workarounds=workarounds))


@pytest.fixture(scope="module")
def dense_random(device_runs, steps, workarounds):
    return _suite_run("titan_native", device_runs, steps, workarounds)


def _with_dump_of(run, tmp_path, edit=None):
    """``run`` pointing at a copy of its dumped step-0 weights and step-1 batches, the weights
    passed through ``edit(name, tensor) -> tensor``."""
    copy = tmp_path / "run"
    for part in (dump_layout.INITIAL, dump_layout.BATCHES):
        shutil.copytree(dump_layout.dump_folder(run.run_dir) / part, dump_layout.dump_folder(copy) / part,
                        ignore=shutil.ignore_patterns(dump_layout.INITIAL_HF))
    if edit is not None:
        for path in dump_layout.initial_weight_files(dump_layout.initial_weights_dir(copy)):
            torch.save({k: edit(k, v) for k, v in torch.load(path, weights_only=True).items()}, path)
    return replace(run, run_dir=copy)


def _another_draw(seed=1234):
    generator = torch.Generator().manual_seed(seed)

    def edit(name, tensor):  # every layer matrix redrawn from its own mean and std
        if not name.startswith("layers.") or tensor.dim() < 2:
            return tensor
        return (torch.randn(tensor.shape, generator=generator) * tensor.std() + tensor.mean()).to(tensor.dtype)

    return edit


def test_a_random_init_run_is_held_to_the_forward_of_its_own_step0_weights(dense_random):
    expectation = expectation_for_run(dense_random)
    assert "dumped step-0 weights" in expectation.source and expectation.init is not None
    assert expectation.tolerance_name == "initial_forward_fp32"
    assert abs(dense_random.steps[0].loss - expectation.value) <= expectation.tolerance


def test_the_registry_states_the_rule_and_the_checks_compute_it(dense_random, monkeypatch):
    """The registry states the rule, a value it computes none of (harness/registry/
    expectations.py ``ExpectationRule``); the checks hold the run to what their forward of the
    step-0 weights computes (harness/checks/reference_forward.py ``expectation_for_run``)."""
    rule = ExpectationRegistry().rule(dense_random.spec.backend, dense_random.spec.model, "random", "cpu",
                                      dense_random.spec.mask, dense_random.nproc)
    assert rule.value is None and rule.lm_head_std and rule.initial_weights_forward, rule
    band = initial_weights_forward_band("float32", "cpu")
    monkeypatch.setattr(reference_forward, "initial_weights_forward",
                        lambda run: (8.25, "a stub", band))
    expectation = expectation_for_run(dense_random)
    assert (expectation.value, expectation.source, expectation.tolerance) == (8.25, "a stub", band.value)
    assert expectation.init is not None and "ln V" in expectation.init.source


def test_weights_the_run_did_not_start_from_fail(dense_random, tmp_path):
    own = expectation_for_run(dense_random)
    other = expectation_for_run(_with_dump_of(dense_random, tmp_path, _another_draw()))
    problem = other.check(dense_random.steps[0].loss)
    assert problem and problem.startswith("first-step loss") and "initial_forward_fp32" in problem
    # ln V + s^2/2 cannot tell the two draws apart: they are as far from it as each other
    assert abs(other.value - own.value) <= own.init.tolerance


def test_a_step1_loss_just_outside_the_band_fails(dense_random, tmp_path):
    expectation = expectation_for_run(_with_dump_of(dense_random, tmp_path))
    problem = expectation.check(expectation.value + 2 * expectation.tolerance)
    assert problem and problem.startswith("first-step loss")


def test_every_rank_s_batch_is_needed(dense_random, tmp_path):
    run = _with_dump_of(dense_random, tmp_path)
    dump_layout.batch_file(dump_layout.dump_folder(run.run_dir), rank=1, step=1).unlink()
    with pytest.raises(MissingExpectation, match="1 rank batch dump.* for 2 ranks"):
        expectation_for_run(run)


@pytest.mark.slow
def test_a_planted_forward_fails_where_the_analytic_value_cannot_see_it(backend_runs):
    run = backend_runs.get(RunSpec("titan_native", init="random", steps=2,
                                   plants=("rope_theta_x10",)))
    expectation = expectation_for_run(run)
    problem = expectation.check(run.steps[0].loss)
    assert problem and problem.startswith("first-step loss"), problem


def test_a_dump_that_is_not_this_model_s_state_is_an_error_naming_it(dense_random, tmp_path):
    wo = "layers.0.attention.wo.weight"
    run = _with_dump_of(dense_random, tmp_path, lambda k, v: v[:, :-1] if k == wo else v)
    with pytest.raises(MissingExpectation, match="not an HF checkpoint.*mis-shaped.*o_proj"):
        expectation_for_run(run)

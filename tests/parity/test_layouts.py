"""Every parallel layout trains the same model as the reference (harness/registry/layouts.py).

Specification, for each backend's tiny pretrained run in each layout that applies to its model
(harness/launch/run_matrix.py ``layout_cases``: TP, CP, EP, gradient accumulation, activation
checkpointing, compile; FSDP x TP, HSDP, FSDP x EP at 4 ranks), on the cpu and cuda tiers:
- every check of the run template holds (it completes, finite losses and grad norms, the HF
  checkpoint it saves is complete and reloads, no two data-parallel ranks start from one
  shard); its first step is held by the reference below, on its own batch, instead of a
  recorded loss of the FSDP run's batch;
- its loss, pre-clip grad norm and learning rate follow the in-process reference trajectory
  on the run's own global batches (every data-parallel rank's rows of the step, every
  microbatch), within the same tolerances as the FSDP run (``torchrun_loss``, ``grad_norm``);
- every tensor of the checkpoint it saves carries the reference trajectory's update (error,
  size ratio and direction), as the FSDP run's does;
- where it reads the FSDP run's own batches (``Layout.same_batches_as_fsdp``: EP, gradient
  accumulation, activation checkpointing, compile), it equals the FSDP run step by step within
  ``layout_loss`` / ``layout_grad_norm``: what only the reduction order may move. This is the
  check that sees an expert gradient doubled under EP, which Adam all but hides from the
  weights and the bf16 reference band hides from the loss;
- where it trains an MoE on the FSDP run's batches, its step-1 routing counts (summed over the
  ranks) and expert_bias update equal the FSDP run's exactly.

Known issues are judged by their signatures, with the layout in their ``where``: a trajectory
as the FSDP run's is (check ``first_step_loss``, observed ``deviation``: the step-1 loss minus
the reference's), the saved weights as ``saved_weights_vs_reference``, the FSDP comparison as
``layout_vs_fsdp``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.backends import BACKENDS
from harness.checks import run_checks as checks
from harness.parity import curves
from harness.parity import models as M
from harness.registry import known_issues
from harness.registry.tolerances import parity_regime_for
from harness.upstream import titan_api

# The template's checks a layout's run gets as they are; its first step is held to the
# reference on its own batch (the recorded first-step loss is the FSDP run's batch's).
LAYOUT_RUN_CHECKS = [c for c in checks.RUN_CHECKS if c != "first_step_loss"]


def _model_dir(backend: str) -> Path:
    return Path(BACKENDS[backend].size("tiny").weights_dir)


def _regime(backend: str) -> str:
    return parity_regime_for(M.Qwen3Arch.from_dir(_model_dir(backend)))


@pytest.fixture(scope="module")
def layout_run(device_runs, steps, workarounds):
    """``layout_run(case)``: the case's run (one launch per session), after its completion
    check (a run a known issue stops is an xfail naming it)."""
    def get(case, plants=()):
        from dataclasses import replace

        spec = case.run_spec(steps, workarounds)
        profile = device_runs(case.device).profile
        if spec.ranks(profile) < case.layout_spec.ranks:
            pytest.skip(f"{case.id} needs {case.layout_spec.ranks} ranks; this {profile.kind} host "
                        f"has {profile.ranks_per_node}")
        if plants:
            spec = replace(spec, plants=tuple(plants))
        return checks.completed_or_known(device_runs(case.device).get(spec), steps)
    return get


def reference_of(case, steps, result):
    """The reference trajectory on the run's own batches, masked as the run's model masks
    packed rows (the transformers backend: as its generation masks them)."""
    from harness.checks.reference_forward import model_masking

    lay = case.layout_spec
    return curves.reference_trajectory(_model_dir(case.backend), steps, model_masking(result),
                                       dp=lay.data_parallel, rows_per_rank=lay.rows_per_rank)


def _judge(check, problem, result, deviation):
    verdict = known_issues.judge(check, problem, {"deviation": deviation}, result.workarounds,
                                 **result.where())
    known_issues.settle(verdict, problem)


@pytest.mark.parametrize("check", LAYOUT_RUN_CHECKS)
def test_layout_run(layout_case, check, layout_run, steps):
    result = layout_run(layout_case)
    verdict, outcome = checks.judge_and_record(check, result, steps)
    known_issues.settle(verdict, outcome.problem, result.describe())


def test_layout_follows_the_reference_trajectory(layout_case, layout_run, steps):
    result = layout_run(layout_case)
    ref = reference_of(layout_case, steps, result)
    reports = curves.curve_reports(layout_case.id, result, "reference (its own batches)", ref,
                                   _regime(layout_case.backend))
    _judge("first_step_loss", curves.curves_problem(reports, result.describe()), result,
           result.losses[0] - ref.losses[0])


def test_layout_saved_weights_are_the_reference_trajectorys(layout_case, layout_run, steps):
    from harness.references.model import load_hf_tensors

    result = layout_run(layout_case)
    verdict, outcome = checks.verdict("hf_checkpoint_complete", result, steps)
    known_issues.settle(verdict, outcome.problem, result.describe())
    model_dir = _model_dir(layout_case.backend)
    ref = reference_of(layout_case, steps, result)
    saved = load_hf_tensors(sorted(set(result.hf_checkpoint_dirs))[-1])
    problem = curves.saved_weights_problem(layout_case.id, saved, load_hf_tensors(model_dir), ref,
                                           _regime(layout_case.backend), device=result.device)
    _judge("saved_weights_vs_reference", problem and f"{problem}\n{result.describe()}", result,
           result.losses[0] - ref.losses[0])


def test_layout_equals_the_fsdp_run(fsdp_layout_case, layout_run, device_runs, steps, workarounds):
    case = fsdp_layout_case
    result = layout_run(case)
    fsdp = device_runs(case.device).get(case.fsdp_case().run_spec(steps, workarounds=workarounds))
    reports = curves.curve_reports(case.id, result, "the FSDP run", fsdp, _regime(case.backend),
                                   loss="layout_loss", grad_norm="layout_grad_norm")
    _judge("layout_vs_fsdp", curves.curves_problem(reports, result.describe(), fsdp.describe()), result,
           result.losses[0] - fsdp.losses[0])


def _step1_balance(run, steps) -> dict[str, tuple]:
    """Per MoE layer, step 1: the routing counts summed over the ranks, in units of one count
    per token and chosen expert (the run's own ``moe_routing_counts`` ratio divided out: a
    layout that recomputes the forward counts twice, a known issue; and the tensor-parallel
    ranks of one data-parallel group route the same tokens, so each token counts once per
    group), and the expert_bias after the update of the lowest rank holding the layer (a
    pipeline stage holds its own layers only)."""
    from harness.registry import dump_layout
    from harness.registry.layouts import layout

    ratio = checks.RUN_CHECKS["moe_routing_counts"](run, steps).observed["counts_ratio"]
    first = {rank: records[0]["layers"] for rank, records in dump_layout.balance_records(run.run_dir).items()}
    tp = layout(run.layout).tp
    names = sorted({name for layers in first.values() for name in layers})
    holding = {name: [layers[name] for _, layers in sorted(first.items()) if name in layers]
               for name in names}
    return {name: (sum(layer["counts_before"].float() for layer in held) / (ratio * tp),
                   held[0]["bias_after"]) for name, held in holding.items()}


def test_moe_load_balancing_equals_the_fsdp_runs(moe_fsdp_layout_case, layout_run, device_runs, steps,
                                                workarounds):
    """Same weights and rows at step 1, so the same routing in the first MoE layer: its counts,
    summed over the ranks (EP's ranks count the tokens their routers chose for), and the
    expert_bias update they drive equal the FSDP run's exactly. A later layer's router reads
    the bf16 experts' output of the layers before it, which the layout groups and reduces
    otherwise: there a token may swap near-tied experts, and the share of routing choices that
    moved is held to the policy's ``router_flips``."""
    from harness.registry.tolerances import parity_tolerance

    case = moe_fsdp_layout_case
    result = layout_run(case)
    fsdp = device_runs(case.device).get(case.fsdp_case().run_spec(steps, workarounds=workarounds))
    mine, theirs = _step1_balance(result, steps), _step1_balance(fsdp, steps)
    assert list(mine) == list(theirs)
    first = next(iter(mine))
    differ = [f"{first}: {what}" for what, a, b in (("routing counts", mine[first][0], theirs[first][0]),
                                                   ("expert_bias", mine[first][1], theirs[first][1]))
              if not torch.equal(a, b)]
    band = parity_tolerance("router_flips", _regime(case.backend)).atol
    moved = {name: float((mine[name][0] - theirs[name][0]).abs().sum() / 2 / theirs[name][0].sum())
             for name in mine}
    differ += [f"{name}: {share:.3%} of routing choices moved (> {band:.0%})"
               for name, share in moved.items() if share > band]
    assert not differ, f"{case.id} vs the FSDP run at step 1: " + "; ".join(differ)


# --------------------------------------------------------------------------- planted defects
# Each plant acts only where its layout is in use (harness/plants/in_torchtitan.py), and the
# check named beside it must fail on the planted run.

def _case(backend, layout_name):
    from harness.launch.run_matrix import LayoutCase

    return LayoutCase("cpu", backend, layout_name)


# One planted EP run carries both MoE plants: doubled expert gradients leave the routing counts
# alone, and counts added twice leave training alone (the bias update takes only their sign).
EP_PLANTS = ("ep_expert_grads_doubled", "moe_counts_twice")


def test_an_expert_gradient_doubled_under_ep_is_caught_by_the_fsdp_run(layout_run, device_runs, steps,
                                                                       workarounds):
    """pytorch #160285: the loss curve barely moves (inside the bf16 reference band), the grad
    norm does. It takes trained experts: where the generation's HF load leaves them at random
    init (a known issue), their gradients are too small a part of the norm to show."""
    case = _case("nki_moe", "ep")
    unloaded = known_issues.applicable("first_step_loss", backend="nki_moe", init="pretrained", size="tiny",
                                       generation=titan_api.generation())
    if unloaded:
        pytest.skip(f"the experts are not loaded here ({unloaded[0].name}): the plant shows on "
                    f"trained experts only")
    planted = layout_run(case, plants=EP_PLANTS)
    fsdp = device_runs("cpu").get(case.fsdp_case().run_spec(steps, workarounds=workarounds))
    reports = curves.curve_reports(case.id, planted, "the FSDP run", fsdp, _regime(case.backend),
                                   loss="layout_loss", grad_norm="layout_grad_norm")
    failing = [r.what for r in reports if not r.ok]
    assert "grad norm (pre-clip)" in failing, curves.curves_problem(reports) or "the planted run passed"
    # trn2's coarse bounds, before its bands are measured, still catch it
    coarse = curves.curve_reports(case.id, planted, "the FSDP run", fsdp, _regime(case.backend),
                                  loss="layout_loss", grad_norm="layout_grad_norm", device="neuron")
    assert "grad norm (pre-clip)" in [r.what for r in coarse if not r.ok], curves.curves_problem(coarse)


def test_a_tp_partial_sum_left_unreduced_is_caught_by_the_reference(layout_run, steps):
    case = _case("titan_native", "tp")
    planted = layout_run(case, plants=("tp_partial_sums_unreduced",))
    reference = reference_of(case, steps, planted)
    reports = curves.curve_reports(case.id, planted, "reference", reference, _regime(case.backend))
    assert curves.curves_problem(reports) is not None, "the planted TP run follows the reference"
    # and at trn2's coarse bounds, before its bands are measured
    coarse = curves.curve_reports(case.id, planted, "reference", reference, _regime(case.backend),
                                  device="neuron")
    assert curves.curves_problem(coarse) is not None, (
        f"the planted TP run passes the coarse bounds; at the CPU's: {curves.curves_problem(reports)}")


def test_routing_counts_added_twice_are_caught(layout_run, steps):
    """A forward that adds its routing counts twice (what recompute does under AC) doubles the
    counts of the EP run; the routing-count check fails on it, and not as the known issue of
    recompute (whose signature is a ratio of exactly 2), whatever the layout's recompute."""
    case = _case("nki_moe", "ep")
    clean, planted = layout_run(case), layout_run(case, plants=EP_PLANTS)
    verdict, outcome = checks.verdict("moe_routing_counts", planted, steps)
    assert verdict.status == "fail", f"routing counts added twice went unnoticed: {verdict}"
    clean_ratio = checks.verdict("moe_routing_counts", clean, steps)[1].observed["counts_ratio"]
    assert outcome.observed["counts_ratio"] == 2 * clean_ratio

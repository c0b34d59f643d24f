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

from dataclasses import replace

import pytest
import torch

from harness.checks import run_checks as checks
from harness.checks.reference_forward import model_masking
from harness.launch import instrumented
from harness.launch.run_matrix import LayoutCase
from harness.parity import curves
from harness.parity import models as M
from harness.references.batch import load_batches, microbatches
from harness.references.loss import valid_labels
from harness.references.model import load_hf_tensors
from harness.registry import dump_layout, known_issues
from harness.registry.layouts import FSDP
from harness.registry.tolerances import parity_regime_for, parity_tolerance
from harness.results import training_state as ts
from harness.upstream import titan_api

# The template's checks a layout's run gets as they are; its first step is held to the
# reference on its own batch (the recorded first-step loss is the FSDP run's batch's).
LAYOUT_RUN_CHECKS = [c for c in checks.RUN_CHECKS if c != "first_step_loss"]


def _regime(result) -> str:
    """The parity regime of the model the run trained."""
    return parity_regime_for(M.Qwen3Arch.from_dir(result.spec.model_dir()))


@pytest.fixture(scope="module")
def layout_run(device_runs, steps, workarounds):
    """``layout_run(case)``: the case's run (one launch per session), after its completion
    check (a run a known issue stops is an xfail naming it)."""
    def get(case, plants=()):
        spec = case.run_spec(steps, workarounds)
        profile = device_runs(case.device).profile
        if spec.ranks(profile) < case.layout_spec.ranks:
            pytest.skip(f"{case.id} needs {case.layout_spec.ranks} ranks; this {profile.kind} host "
                        f"has {profile.ranks_per_node}")
        if plants:
            spec = replace(spec, plants=tuple(plants))
        return checks.completed_or_known(device_runs(case.device).get(spec), steps)
    return get


def reference_of(steps, result):
    """The reference trajectory from the run's weights on its own batches, masked as the run's
    model masks packed rows (the transformers backend: as its generation masks them)."""
    lay = result.spec.layout_spec
    return curves.reference_trajectory(result.spec.weights_dir(), steps, model_masking(result),
                                       dp=lay.data_parallel, rows_per_rank=lay.rows_per_rank)


def _judge(check, problem, result, deviation):
    """Settle the check's verdict; returns the problem observed, None when there was none (a
    known issue has ended the test as an xfail before it returns)."""
    verdict = known_issues.judge(check, problem, {"deviation": deviation}, result.spec.all_workarounds,
                                 **result.where())
    known_issues.settle(verdict, problem)
    return problem


@pytest.mark.parametrize("check", LAYOUT_RUN_CHECKS)
def test_layout_run(layout_case, check, layout_run, steps):
    result = layout_run(layout_case)
    verdict, outcome = checks.judge_and_record(check, result, steps)
    known_issues.settle(verdict, outcome.problem, result.describe())


def test_layout_follows_the_reference_trajectory(layout_case, layout_run, steps):
    result = layout_run(layout_case)
    ref = reference_of(steps, result)
    reports = curves.curve_reports(layout_case.id, result, "reference (its own batches)", ref,
                                   _regime(result))
    problem = _judge("first_step_loss", curves.curves_problem(reports, result.describe()), result,
                     result.losses[0] - ref.losses[0])
    assert problem is None, problem


def test_layout_saved_weights_are_the_reference_trajectorys(layout_case, layout_run, steps):
    result = layout_run(layout_case)
    verdict, outcome = checks.verdict("hf_checkpoint_complete", result, steps)
    known_issues.settle(verdict, outcome.problem, result.describe())
    ref = reference_of(steps, result)
    saved = load_hf_tensors(sorted(set(result.hf_checkpoint_dirs))[-1])
    problem = curves.saved_weights_problem(layout_case.id, saved, load_hf_tensors(result.spec.weights_dir()), ref,
                                           _regime(result), device=result.device)
    _judge("saved_weights_vs_reference", problem and f"{problem}\n{result.describe()}", result,
           result.losses[0] - ref.losses[0])


def test_layout_equals_the_fsdp_run(fsdp_layout_case, layout_run, device_runs, steps, workarounds):
    case = fsdp_layout_case
    result = layout_run(case)
    fsdp = device_runs(case.device).get(case.fsdp_case().run_spec(steps, workarounds=workarounds))
    reports = curves.curve_reports(case.id, result, "the FSDP run", fsdp, _regime(result),
                                   loss="layout_loss", grad_norm="layout_grad_norm")
    problem = _judge("layout_vs_fsdp", curves.curves_problem(reports, result.describe(), fsdp.describe()),
                     result, result.losses[0] - fsdp.losses[0])
    assert problem is None, problem


def _step1_balance(run, steps) -> dict[str, tuple]:
    """Per MoE layer, step 1: the routing counts summed over the ranks, in units of one count
    per token and chosen expert (the run's own ``moe_routing_counts`` ratio divided out: a
    layout that recomputes the forward counts twice, a known issue; and the tensor-parallel
    ranks of one data-parallel group route the same tokens, so each token counts once per
    group), and the expert_bias after the update of the lowest rank holding the layer (a
    pipeline stage holds its own layers only)."""
    ratio = checks.RUN_CHECKS["moe_routing_counts"](run, steps).observed["counts_ratio"]
    first = {rank: records[0]["layers"] for rank, records in dump_layout.balance_records(run.run_dir).items()}
    tp = run.degrees["tensor_parallel_degree"]
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
    case = moe_fsdp_layout_case
    result = layout_run(case)
    fsdp = device_runs(case.device).get(case.fsdp_case().run_spec(steps, workarounds=workarounds))
    mine, theirs = _step1_balance(result, steps), _step1_balance(fsdp, steps)
    assert list(mine) == list(theirs)
    first = next(iter(mine))
    differ = [f"{first}: {what}" for what, a, b in (("routing counts", mine[first][0], theirs[first][0]),
                                                   ("expert_bias", mine[first][1], theirs[first][1]))
              if not torch.equal(a, b)]
    band = parity_tolerance("router_flips", _regime(result)).atol
    moved = {name: float((mine[name][0] - theirs[name][0]).abs().sum() / 2 / theirs[name][0].sum())
             for name in mine}
    differ += [f"{name}: {share:.3%} of routing choices moved (> {band:.0%})"
               for name, share in moved.items() if share > band]
    assert not differ, f"{case.id} vs the FSDP run at step 1: " + "; ".join(differ)


# --------------------------------------------------------------------------- planted defects
# Each plant acts only where its layout is in use (harness/plants/in_torchtitan.py), and the
# check named beside it must fail on the planted run.

def _case(backend, layout_name):
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
    reports = curves.curve_reports(case.id, planted, "the FSDP run", fsdp, _regime(planted),
                                   loss="layout_loss", grad_norm="layout_grad_norm")
    failing = [r.what for r in reports if not r.ok]
    assert "grad norm (pre-clip)" in failing, curves.curves_problem(reports) or "the planted run passed"
    # trn2's coarse bounds, before its bands are measured, still catch it
    coarse = curves.curve_reports(case.id, planted, "the FSDP run", fsdp, _regime(planted),
                                  loss="layout_loss", grad_norm="layout_grad_norm", device="neuron")
    assert "grad norm (pre-clip)" in [r.what for r in coarse if not r.ok], curves.curves_problem(coarse)


def test_a_tp_partial_sum_left_unreduced_is_caught_by_the_reference(layout_run, steps):
    case = _case("titan_native", "tp")
    planted = layout_run(case, plants=("tp_partial_sums_unreduced",))
    reference = reference_of(steps, planted)
    reports = curves.curve_reports(case.id, planted, "reference", reference, _regime(planted))
    assert curves.curves_problem(reports) is not None, "the planted TP run follows the reference"
    # and at trn2's coarse bounds, before its bands are measured
    coarse = curves.curve_reports(case.id, planted, "reference", reference, _regime(planted),
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


# ------------------------------------------------- gradient accumulation with uneven valid tokens
# The condition a GA normalisation bug needs: microbatches whose valid-label counts differ
# (torchtune #1875, torchtitan #1759/#1842/#2206). Packed pretraining rows never have one (every
# label is valid), so the cheap form of ``ga=2`` is the SFT run (tests/e2e/test_ignored_labels.py:
# prompt labels and EOS padding ignored, 2 ranks x 2 microbatches of 1 row) against the same
# backend's single-batch run on the same rows (FSDP, 1 microbatch of 2 rows per rank).

def sft_ga_pair(backend_runs, plants=()):
    """(the SFT run under ``ga=2``, ``plants`` put in; the single-batch SFT run on its rows)."""
    with instrumented.instrumented_backend("titan_native") as name:
        pair = (backend_runs.get(instrumented.sft_spec(name, plants=plants)),
                backend_runs.get(instrumented.sft_spec(name, layout=FSDP)))
    for run in pair:
        assert run.ok and len(run.steps) == 1, run.describe()
    return pair


def ga_findings(ga, single) -> tuple[list[str], dict]:
    """Everything in which the ``ga=2`` SFT run is not the single-batch run on the same tokens
    (the rows each rank was fed, the step-1 loss, every parameter's step-1 gradient before
    clipping), and what was measured: the valid labels per microbatch, the loss delta, the
    largest relative gradient delta."""
    found = []
    for rank, (a, b) in enumerate(zip(load_batches(ga.run_dir), load_batches(single.run_dir), strict=True)):
        for key in ("inputs", "labels"):
            if not torch.equal(getattr(a.fed, key), getattr(b.fed, key)):
                found.append(f"rank {rank}: the runs were fed other {key}")
    rows = ga.spec.layout_spec.local_batch_size
    counts = [valid_labels([mb.fed.labels]) for mb in microbatches(ga.run_dir, rows)]
    if len(set(counts)) < 2:
        found.append(f"valid labels per microbatch {counts}: even, the condition is not reached")
    loss_band = parity_tolerance("layout_loss", "float32").atol
    loss_delta = ga.losses[0] - single.losses[0]
    if abs(loss_delta) > loss_band:
        found.append(f"step-1 loss {ga.losses[0]!r} vs single batch {single.losses[0]!r}: "
                     f"{loss_delta:+.3e} (band {loss_band:g})")
    (step_a, mine, holes_a), (step_b, theirs, holes_b) = (ts.first_step_grads(r.run_dir) for r in (ga, single))
    found += [f"ga=2 run's gradients: {p}" for p in holes_a] + [f"single batch's gradients: {p}" for p in holes_b]
    if (step_a, step_b) != (1, 1) or not mine:
        found.append(f"gradients recorded at steps {step_a} and {step_b} ({len(mine)} parameters)")
    deltas = ts.gradient_deltas(mine, theirs)
    band = parity_tolerance("layout_gradients", "float32").rtol
    found += [f"{name}: gradient differs by {d:.3e} of its size (band {band:g})"
              for name, d in sorted(deltas.items(), key=lambda kv: -kv[1]) if d > band][:20]
    worst = max(deltas.values(), default=float("nan"))
    return found, {"valid per microbatch": counts, "loss delta": loss_delta, "worst gradient delta": worst}


def test_gradient_accumulation_over_uneven_valid_tokens_is_the_single_batch(backend_runs):
    ga, single = sft_ga_pair(backend_runs)
    found, measured = ga_findings(ga, single)
    assert not found, f"ga=2 vs single batch ({measured}):\n" + "\n".join(found)


def test_a_per_microbatch_mean_is_caught_by_loss_and_gradients(backend_runs):
    """The default tier's planted run of tests/e2e/test_ignored_labels.py (``ga_microbatch_mean``:
    torchtitan's forward_backward_step normalising each microbatch by its own valid labels)."""
    ga, single = sft_ga_pair(backend_runs, ("ga_microbatch_mean",))
    found, measured = ga_findings(ga, single)
    assert any("step-1 loss" in f for f in found), f"the loss saw nothing ({measured})"
    assert any("gradient differs" in f for f in found), f"the gradients saw nothing ({measured})"


@pytest.mark.slow
def test_a_per_microbatch_normalised_backward_is_caught_by_the_gradients_alone(backend_runs):
    """``ga_microbatch_backward``: each microbatch's backward normalised by its own valid labels
    while the logged loss stays the right one (torchtune #1875's shape): the loss agrees, and
    only the gradients show it."""
    ga, single = sft_ga_pair(backend_runs, ("ga_microbatch_backward",))
    found, measured = ga_findings(ga, single)
    assert not any("step-1 loss" in f for f in found), f"the plant moved the loss ({measured})"
    assert any("gradient differs" in f for f in found), f"the gradients saw nothing ({measured})"


# ------------------------------------------------- full activation checkpointing on the MoE
# The condition an AC bug of the MoE needs: a recompute of its stateful forward (it adds its
# routing counts to tokens_per_expert_E, which the load-balancing update reads; torchtitan
# #1593 was found under full recompute). Full AC against no AC, same weights and rows.

def _balance_by_step(run, steps) -> dict[tuple[int, str], tuple]:
    """Per (step, MoE layer): the routing counts summed over the ranks, the run's own
    ``moe_routing_counts`` ratio divided out (the known recompute doubling), and the
    expert_bias after the update (rank 0's: every rank holds the same)."""
    ratio = checks.RUN_CHECKS["moe_routing_counts"](run, steps).observed["counts_ratio"]
    records = dump_layout.balance_records(run.run_dir)
    out = {}
    for s, record in enumerate(records[min(records)]):
        for name, layer in record["layers"].items():
            counts = sum(records[r][s]["layers"][name]["counts_before"] for r in records)
            out[(record["step"], name)] = (counts / ratio, layer["bias_after"], ratio)
    return out


def ac_findings(full, none, steps) -> tuple[list[str], dict]:
    """Everything in which the full-AC run is not the no-AC run: every step's routing counts
    (each run's own recompute ratio divided out: the known issue's doubling is judged by the
    routing-count check, by its signature) and expert_bias updates, in every MoE layer, and
    every parameter's step-1 gradient, bit for bit (the same ops on the same values)."""
    found = []
    mine, theirs = _balance_by_step(full, steps), _balance_by_step(none, steps)
    if list(mine) != list(theirs):
        found.append(f"MoE layers or steps recorded differ: {list(mine)[:4]} vs {list(theirs)[:4]}")
    for key in sorted(set(mine) & set(theirs)):
        for what, a, b in (("routing counts", mine[key][0], theirs[key][0]),
                           ("expert_bias after the update", mine[key][1], theirs[key][1])):
            if not torch.equal(a, b):
                found.append(f"step {key[0]} {key[1]}: {what} differ by {(a - b).abs().max().item():.3e}")
    (step_a, g_full, holes_a), (step_b, g_none, holes_b) = (ts.first_step_grads(r.run_dir) for r in (full, none))
    found += [f"full AC's gradients: {p}" for p in holes_a] + [f"no AC's gradients: {p}" for p in holes_b]
    if (step_a, step_b) != (1, 1) or not g_full:
        found.append(f"gradients recorded at steps {step_a} and {step_b} ({len(g_full)} parameters)")
    deltas = ts.gradient_deltas(g_full, g_none)
    found += [f"{name}: step-1 gradient differs by {d:.3e} of its size"
              for name, d in sorted(deltas.items(), key=lambda kv: -kv[1]) if d > 0][:20]
    ratios = {mine[k][2] for k in mine}
    return found, {"counts ratio (full AC)": sorted(ratios),
                   "worst gradient delta": max(deltas.values(), default=float("nan")),
                   "loss delta": full.losses[0] - none.losses[0]}


def _ac_pair(layout_run, plants=()):
    return (layout_run(_case("nki_moe", "ac=full"), plants=plants), layout_run(_case("nki_moe", "ac=none")))


def test_full_ac_on_the_moe_equals_no_ac(layout_run, steps):
    full, none = _ac_pair(layout_run)
    found, measured = ac_findings(full, none, steps)
    assert not found, f"nki_moe ac=full vs ac=none ({measured}):\n" + "\n".join(found)


@pytest.mark.slow
def test_a_moe_forward_that_reads_its_counts_on_recompute_is_caught(layout_run, steps):
    """``moe_forward_reads_its_counts`` (torchtitan's MoE.forward): the first forward of a step
    computes what it always did, the recompute under full AC other routing weights."""
    full, none = _ac_pair(layout_run, ("moe_forward_reads_its_counts",))
    found, measured = ac_findings(full, none, steps)
    assert any("gradient differs" in f for f in found), f"the recompute went unnoticed ({measured})"
    assert measured["loss delta"] == 0, f"the plant moved step 1's loss ({measured})"

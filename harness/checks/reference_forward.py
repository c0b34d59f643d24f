"""The independent HF forward of a run's weights on the batches it was fed: the computed sources
of a launched run's expectations, and the recorded fixture losses.

``first_step_loss(model, batches, mask)``: an HF model (transformers, float32, host CPU) on every
rank's step-1 batch, with a run's masking of packed rows, reduced by torchtitan's loss contract
(harness/references/loss.py). The maskings (harness/backends BackendSpec.attention):

- ``document``: attention confined to each packed document, RoPE at per-document positions (what
  HF does by itself when position_ids restart and attention_mask is None; torchtitan's native
  flex/varlen masks do the same);
- ``causal``: causal attention across the packed row at per-document positions (an all-ones 2D
  mask turns HF's packing detection off: the transformers backend's default on 0.3.0);
- ``row_causal``: causal attention over the row at row positions 0..seq-1, the row read as one
  sequence (native qwen3 ``attn_backend="sdpa"``).

On a launched run (harness/results/run_result.py RunResult), from the rank dumps (read through
harness/references/batch.py and harness/registry/dump_layout.py):
``hf_forward`` (a full-size run's HF weights on its own step-1 batches) and
``initial_weights_forward`` (a random-init run's dumped step-0 weights, converted to HF by the
harness). ``expectation_for_run``: the run's expected first-step loss, the rule the
expectations registry states for it (harness/registry/expectations.py, data only) computed
with these forwards or the analytic references (harness/references/expected_loss.py).
``hf_loss_parts``: the same forward's parts of the contract, for checks of the normalisation.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from harness.diagnosis import rank_dump
from harness.parity.conformance.native_to_hf import NotConvertible
from harness.references.batch import Batch, load_batches
from harness.references.expected_loss import expectation_of
from harness.references.loss import LossParts, global_avg_loss, rank_ce_sum, valid_labels
from harness.registry.dump_layout import initial_weights_dir
from harness.registry.expectations import Expectation, ExpectationRegistry, MissingExpectation, model_config
from harness.registry.tolerances import RANDOM_INIT_DRAW, LossBand, initial_weights_forward_band
from harness.upstream import hf_masking

MASKINGS = ("document", "causal", "row_causal")


def hf_model(weights_dir: str | Path):
    """The HF model of a checkpoint folder, float32, in eval mode."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415  heavy: transformers, for the HF forward alone

    return AutoModelForCausalLM.from_pretrained(str(weights_dir), dtype=torch.float32).eval()


def _known(mask: str) -> str:
    if mask not in MASKINGS:
        raise ValueError(f"unknown masking {mask!r}: one of {MASKINGS}")
    return mask


def rank_ce_sums(model, batches: list[Batch], mask: str) -> list[torch.Tensor]:
    """Each rank's summed token CE under ``model`` on its batch with ``mask`` (positions None:
    the row's)."""
    _known(mask)
    sums = []
    with torch.no_grad():
        for batch in batches:
            if mask == "row_causal" or batch.positions is None:
                batch = batch.masked_as("row_causal")
            logits = model(input_ids=batch.inputs, position_ids=batch.positions,
                           attention_mask=hf_masking.attention_mask(batch.inputs, mask),
                           use_cache=False).logits
            sums.append(rank_ce_sum(logits, batch.labels))
    return sums


def first_step_loss(model, batches: list[Batch], mask: str, *,
                    dtype: torch.dtype = torch.float32) -> float:
    """torchtitan's logged step-1 ``global_avg_loss`` recomputed with ``model`` on every rank's
    batch, masked as ``mask``, accumulated in ``dtype``."""
    sums = rank_ce_sums(model, batches, mask)
    return global_avg_loss(sums, valid_labels(b.labels for b in batches), dtype=dtype)


def _as_fed(batch: Batch) -> Batch:
    """A rank's dumped batch as the model and the loss were fed it, at the dataloader's
    positions."""
    return replace(batch.fed, positions=batch.positions)


def independent_first_step_loss(weights_dir: str | Path, batches: list[Batch], mask: str) -> float:
    """The step-1 loss of the HF model in ``weights_dir`` on every rank's dumped step-1 batch
    (harness/rank/step0.py), masked as the run's model masks. Holds on any data, so on C4 as on
    the fixture corpus."""
    mask = _known(mask)  # before the model loads
    return first_step_loss(hf_model(weights_dir), [_as_fed(b) for b in batches], mask,
                           dtype=torch.float64)


def hf_loss_parts(model_dir: str | Path, batches: list[Batch]) -> LossParts:
    """The parts of the contract under the HF model in ``model_dir`` on every rank's dumped
    batch at the positions the model was fed, each document attended to on its own."""
    fed = [b.fed for b in batches]
    return LossParts.of(rank_ce_sums(hf_model(model_dir), fed, "document"), [b.labels for b in fed])


def hf_forward(run) -> tuple[float, str]:
    """A full-size run's step-1 loss recomputed from its HF weights on its own step-1 batch."""
    spec = run.spec
    weights = spec.weights_dir()
    if weights is None:
        raise MissingExpectation(f"{spec.name}: a random init has no HF weights "
                                 f"(RunSpec.weights_dir) to recompute its step 1 from")
    try:
        batches = load_batches(run.run_dir)
    except FileNotFoundError as error:
        raise MissingExpectation(f"{spec.name}: {error} (full-size configs dump each rank's "
                                 f"step-1 batch: harness/rank/observers.py)") from None
    value = independent_first_step_loss(weights, batches, spec.mask)
    return value, (f"independent HF forward (float32, CPU) of {weights} on the run's own step-1 "
                   f"batch ({len(batches)} rank(s), {spec.mask} masking)")


def initial_weights_forward(run) -> tuple[float, str, LossBand] | None:
    """A random-init run's step-1 loss recomputed from what it started from: the float32
    transformers forward (``independent_first_step_loss``) of the step-0 weights its ranks
    dumped (harness/diagnosis/rank_dump.py), converted to HF by the harness
    (harness/parity/conformance/native_to_hf.py), on every rank's own step-1 batch
    (harness/rank/step0.py), with the run's masking. None where the run dumped no
    weights (over ``MAX_PARAMS``, neuron ranks) or its device has no measured band
    (harness/registry/tolerances.py ``initial_weights_forward_band``)."""
    spec = run.spec
    if spec.init != "random" or run.run_dir is None:
        return None
    dumped = initial_weights_dir(run.run_dir)
    band = initial_weights_forward_band(spec.size_spec.precision, run.device)
    if dumped is None or band is None:
        return None
    try:
        batches = load_batches(run.run_dir)
    except FileNotFoundError as error:
        raise MissingExpectation(f"{spec.name}: its step-0 weights were dumped but not its ranks' "
                                 f"step-1 batches ({error}; the launcher installs them in every "
                                 f"rank: harness/rank/observers.py)") from None
    if len(batches) != run.nproc:
        raise MissingExpectation(f"{spec.name}: {len(batches)} rank batch dump(s) for "
                                 f"{run.nproc} ranks: a global-average loss needs every rank's")
    model_dir = spec.model_dir()
    try:
        weights = rank_dump.hf_weights_from_dump(dumped, model_dir)
    except NotConvertible as error:
        raise MissingExpectation(f"{spec.name}: its dumped step-0 weights ({dumped}) are not an HF "
                                 f"checkpoint of {model_dir}: {error}") from None
    mask = model_masking(run)
    value = independent_first_step_loss(weights, batches, mask)
    return value, (f"independent HF forward (float32, CPU) of the run's dumped step-0 weights "
                   f"on its own step-1 batches ({len(batches)} rank(s), {mask} masking)"), band


def model_masking(run) -> str:
    """How the run's model masks packed rows: the run's masking, except where its generation's
    transformers backend discards the dataloader's positions (spring-2026: causal over the row
    at row positions, ``titan_api.transformers_backend().masking``). That defect is known
    issue spring2026-hf_v5-row-positions and is held by the checks that see it (the parity
    suite's attention_mask and logits_vs_reference); the forward of the run's weights holds
    the rest of its step 1."""
    if run.spec.backend != "hf_v5" or run.spec.mask != "causal":
        return run.spec.mask
    from harness.upstream import titan_api  # noqa: PLC0415  heavy: torchtitan; the CLI lists checks without it

    return titan_api.transformers_backend().masking


def run_model_dir(run) -> Path | None:
    """A full-size run's model config dir (the one it read); None: the fixtures' by model key."""
    return run.spec.model_dir() if run.spec.size == "full" else None


def expectation_for_run(run) -> Expectation:
    """The expected first-step loss of a launched run: the rule the registry states for its key,
    computed. A random-init run that dumped its step-0 weights is held to their forward
    (``initial_weights_forward``), and that forward to ln V + s^2/2 in the draw band (``init``;
    harness/registry/tolerances.py RANDOM_INIT_DRAW), except a tied config under the rule's
    ``analytic_unless_tied``: its forward alone (without a dump, the analytic value, saying it may
    not hold)."""
    spec = run.spec
    if spec.model is None:
        raise MissingExpectation(f"{spec.name}: the model it trains is not one the harness "
                                 f"knows, so it has no expectation")
    model_dir = run_model_dir(run)
    rule = ExpectationRegistry().rule(spec.backend, spec.model, spec.init, run.device, spec.mask,
                                      run.nproc, run.versions.get("torchtitan-generation"),
                                      own_config=model_dir is not None)
    if rule.hf_forward:
        return rule.expectation(*hf_forward(run))
    forward = initial_weights_forward(run) if rule.initial_weights_forward else None
    expected = expectation_of(rule, spec.model, model_dir)
    tied = rule.analytic_unless_tied and model_config(spec.model, model_dir).get("tie_word_embeddings")
    if forward is None:
        if tied:  # no dump (neuron, over MAX_PARAMS): the analytic value, as such runs keep it
            return replace(expected, source=f"{expected.source}; it may not hold for this tied config "
                                            f"(known issue {rule.analytic_unless_tied}), and the run "
                                            f"dumped no step-0 weights to hold it to instead")
        return expected
    value, source, band = forward
    if tied:
        # ln V + s^2/2 assumes logits independent of the input token; under this known issue a
        # tied output layer's init predicts each position's own input token at a depth and
        # width the harness does not know: the run is held to its step-0 weights' forward alone
        return Expectation(rule.key, value, band.value, band.name,
                           f"{source}; ln V + s^2/2 is not held: the config ties its output layer "
                           f"to the embedding, and known issue {rule.analytic_unless_tied} makes "
                           f"such an init predict each position's own input token "
                           f"(harness/registry/known_issues/)")
    init = replace(expected, tolerance=RANDOM_INIT_DRAW.value, tolerance_name=RANDOM_INIT_DRAW.name,
                   what="step-0 weights' forward")
    return Expectation(rule.key, value, band.value, band.name, source, init=init)

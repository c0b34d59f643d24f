"""The checks of one launched run, written once: used by the run template of every device
(tests/e2e/test_runs.py) and by the main job (``python -m harness run``).

Each check returns an ``Outcome``: its own problem (None: it passed) and the quantities it
observed. ``verdicts`` then judges every outcome against the known-issues registry, so a known
upstream defect is accepted only when it shows exactly as recorded.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.checks.reference_forward import expectation_for_run
from harness.diagnosis.diagnose import diagnose
from harness.launch.run import remove_checkpoints
from harness.rank import step0 as rank_step0
from harness.references.batch import load_batches
from harness.registry import dump_layout, environment, known_issues
from harness.registry.expectations import ExpectationRegistry, MissingExpectation
from harness.results.run_result import RunResult


@dataclass(frozen=True)
class Outcome:
    problem: str | None
    observed: dict[str, Any] = field(default_factory=dict)
    how: str = ""  # how the comparison is made, for the report


def completed(run: RunResult, steps: int) -> Outcome:
    problems = []
    if run.timed_out:
        problems.append("the run timed out and was killed")
    elif run.returncode != 0:
        problems.append(f"the launcher exited with code {run.returncode}")
    logged = [s.step for s in run.steps]
    first = run.spec.first_step
    if logged != list(range(first, steps + 1)):
        problems.append(f"logged steps {logged}, expected {first}..{steps}")
    observed = {"steps_logged": len(logged)}
    if problems:
        observed["error"] = run.first_error()
        if observed["error"]:
            problems.append(f"first error: {observed['error']}")
    return Outcome("; ".join(problems) or None, observed,
                   "exit code 0, no timeout, every step logged")


def finite(run: RunResult, steps: int) -> Outcome:
    if not run.steps:
        return Outcome("no step was logged")
    bad = [f"step {s.step}: loss {s.loss}, grad norm {s.grad_norm}" for s in run.steps
           if not (math.isfinite(s.loss) and math.isfinite(s.grad_norm))]
    return _diagnosed(run, Outcome("; ".join(bad) or None,
                                   {"first_nonfinite_step": run.first_nonfinite_step},
                                   "every loss and grad norm finite"))


def first_step_loss(run: RunResult, steps: int) -> Outcome:
    if not run.steps:
        return Outcome("no step was logged")
    try:
        expectation = expectation_for_run(run)
    except MissingExpectation as error:
        observed = run.steps[0].loss
        return Outcome(f"{error}. Observed step-1 loss {observed:.6f}: record it in "
                       f"fixtures/expectations.toml with its source and tolerance")
    observed = run.steps[0].loss
    return _diagnosed(run, Outcome(
        expectation.check(observed),
        expectation.observations(observed), expectation.how()))


def _diagnosed(run: RunResult, outcome: Outcome) -> Outcome:
    """A failing first step, said where (harness/diagnosis): the first module of the run's
    model that parts from the float64 reference on its first batch and starting weights, and
    the hints whose signature fits. They join the problem and ``observed["diagnosis"]``."""
    if outcome.problem is None:
        return outcome

    found = diagnose(run, outcome.observed.get("observed"), outcome.observed.get("deviation"))
    if found is None:
        return outcome
    return Outcome("\n".join([outcome.problem, *found.lines()]),
                   {**outcome.observed, "diagnosis": found.to_json()}, outcome.how)


def hf_checkpoint_complete(run: RunResult, steps: int) -> Outcome:
    """The HF checkpoint the run saved reloads with transformers: no missing, no unexpected
    keys, every shape right (``from_pretrained`` on the model's own config.json)."""
    dirs = run.hf_checkpoint_dirs
    if not dirs:
        problem = f"no HF checkpoint under {dump_layout.checkpoints(run.run_dir)}"
        return Outcome(problem, {"error": problem})
    return _reload_problems(dirs[-1], run.spec.model_dir())


def _reload_problems(checkpoint: Path, model_dir: Path) -> Outcome:
    """Load ``checkpoint`` the way a user would: its safetensors beside the model's
    config.json in one folder, ``from_pretrained`` on that folder."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415  heavy: transformers, for the reload check alone

    with tempfile.TemporaryDirectory(prefix="hf_reload_") as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shutil.copy(Path(model_dir) / "config.json", folder)
        for path in Path(checkpoint).glob("*.safetensors*"):
            (Path(folder) / path.name).symlink_to(path.resolve())
        try:
            # Mis-shaped keys are reported beside the missing and unexpected ones (listed
            # below as problems), not raised before them.
            _, info = AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.bfloat16, output_loading_info=True, ignore_mismatched_sizes=True)
        except Exception as error:  # a file transformers cannot read at all
            return Outcome(f"transformers could not load {checkpoint}: {error}")
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    kinds = tuple(sorted({re.sub(r"^model\.layers\.\d+\.", "", key) for key in missing}))
    mismatched = sorted(str(m) for m in info.get("mismatched_keys", []))
    problems = [f"{name} ({len(keys)}): {keys[:8]}" for name, keys in
                (("missing keys", missing), ("unexpected keys", unexpected),
                 ("mismatched shapes", mismatched)) if keys]
    return Outcome(("; ".join(problems) + f" reloading {checkpoint}") if problems else None,
                   {"missing": len(missing), "unexpected": len(unexpected),
                    "missing_key_kinds": kinds if missing and not unexpected else None},
                   f"transformers from_pretrained({checkpoint.name}) with {model_dir}/config.json")


def shards_distinct(run: RunResult, steps: int) -> Outcome:
    """No two data-parallel ranks start step 1 from identical shards of a parameter: each
    rank's fingerprint of its local shards (harness/rank/step0.py) against the others', for
    every sharded parameter whose values are not all equal (norm weights of ones and zero
    biases are constant by design). A random init must draw each shard apart; a pretrained
    run's loader must give each rank its own slice of the checkpoint. A single-rank run, or
    one whose parameters are all replicated, has nothing to compare and passes."""
    by_rank = dump_layout.read_fingerprints(run.run_dir)
    if by_rank is None:
        return Outcome(f"no shard fingerprints under {dump_layout.dump_folder(run.run_dir) / dump_layout.SHARDS} "
                       "(the ranks write them at step 1: harness/rank/step0.py)")
    checked, identical = rank_step0.identical_shards(by_rank)
    fraction = len(identical) / len(checked) if checked else 0.0
    # The kinds of parameter affected, whatever their layer (a known issue's signature).
    kinds = tuple(sorted({re.sub(r"^(part\d+\.)?layers\.\d+\.", "", name) for name in identical}))
    observed = {"identical_fraction": fraction, "identical": identical, "checked": len(checked),
                "identical_kinds": kinds, "ranks": len(by_rank)}
    how = (f"sha1 of each rank's local shards at step 1 (harness/rank/step0.py), {len(by_rank)} "
           f"rank(s), {len(checked)} sharded non-constant parameter(s)")
    if not identical:
        return Outcome(None, observed, how)
    return Outcome(f"{len(identical)} of {len(checked)} sharded parameters "
                   f"(fraction {fraction:.3f}) start step 1 with byte-identical shards on "
                   f"different ranks: {identical[:12]}{' ...' if len(identical) > 12 else ''}",
                   observed, how)


def moe_routing_counts(run: RunResult, steps: int) -> Outcome:
    """Each MoE layer's routing counts of step 1, as torchtitan accumulated them for the
    load-balancing update (``tokens_per_expert`` just before the optimizer step, each rank's
    own: harness/rank/hooks.py), count every token the rank fed that step once per expert it
    chose: top-k x the tokens of its step-1 batch (every microbatch; under context parallel its
    share of the sequence). Top-k is read from the router's own choices. A recomputed router
    forward (activation checkpointing) that adds its counts again shows as a ratio of 2.
    Dense models have no router and pass."""
    records = dump_layout.balance_records(run.run_dir)
    if not records:
        return Outcome(None, {}, "no MoE layer recorded load balancing: nothing to count")
    cp = run.degrees["context_parallel_degree"]
    ratios: dict[str, float] = {}
    for rank, steps_records in sorted(records.items()):
        first = next((r for r in steps_records if r.get("step") == 1), None)
        if first is None:
            return Outcome(f"rank {rank} recorded no load balancing at step 1")
        try:
            batch = load_batches(run.run_dir, 1)[rank]
        except (FileNotFoundError, IndexError):
            return Outcome(f"rank {rank}'s step-1 batch was not dumped "
                           f"({dump_layout.dump_folder(run.run_dir) / dump_layout.BATCHES})")
        fed = batch.fed.inputs.numel()
        if batch.fed.inputs.shape[-1] == batch.inputs.shape[-1]:
            fed /= cp  # the dump holds the whole rows; context parallel feeds each rank its share

        for name, layer in first["layers"].items():
            if layer.get("counts_before") is None or not layer.get("tokens"):
                continue
            top_k = float(layer["hist"].sum()) / layer["tokens"]
            ratios[f"rank{rank}.{name}"] = float(layer["counts_before"].float().sum()) / (top_k * fed)
    values = sorted(set(round(v, 6) for v in ratios.values()))
    observed = {"counts_ratio": values[0] if len(values) == 1 else tuple(values), "layers": len(ratios)}
    how = ("sum of tokens_per_expert before the step-1 update / (top-k x tokens fed), per rank and "
           f"MoE layer ({len(ratios)})")
    wrong = {k: v for k, v in ratios.items() if abs(v - 1.0) > 1e-9}
    if not wrong:
        return Outcome(None, observed, how)
    return Outcome(f"routing counts are not one per token and chosen expert: counts / (top-k x "
                   f"tokens fed) = {values} ({len(wrong)} of {len(ratios)} rank-layers, e.g. "
                   f"{dict(list(wrong.items())[:3])})", observed, how)


def published_loss(run: RunResult, steps: int) -> Outcome:
    """The step-1 loss against the source's published number (fixtures/expectations.toml
    ``[[published]]``), on the runs that read the source's data; its own first_step_loss
    expectation (an independent HF forward on the run's batch) holds it on any data."""
    if not run.steps:
        return Outcome("no step was logged")
    expectation = ExpectationRegistry().published(run)
    if expectation is None:
        spec = run.spec
        return Outcome(f"{spec.name}: no published number for {spec.backend}/{spec.model}/{spec.init} "
                       f"on {run.device} with the data it read (published values hold only on "
                       f"the source's data, C4)")
    observed = run.steps[0].loss
    return Outcome(expectation.check(observed),
                   {"deviation": expectation.deviation(observed), "expected": expectation.value,
                    "observed": observed},
                   f"banded: |step-1 - published| <= {expectation.tolerance_name} "
                   f"{expectation.tolerance:g} ({expectation.source})")


# Checks of the runs that reproduce the source's published runs (its data, its device).
PUBLISHED_CHECKS: dict[str, Callable[[RunResult, int], Outcome]] = {"published_loss": published_loss}


# The checks of every run, in order. A check name is also the known-issue registry's ``check``.
RUN_CHECKS: dict[str, Callable[[RunResult, int], Outcome]] = {
    "completed": completed,
    "finite": finite,
    "first_step_loss": first_step_loss,
    "hf_checkpoint_complete": hf_checkpoint_complete,
    "shards_distinct": shards_distinct,
    "moe_routing_counts": moe_routing_counts,
}


def verdict(check: str, run: RunResult, steps: int) -> tuple[known_issues.Verdict, Outcome]:
    outcome = {**RUN_CHECKS, **PUBLISHED_CHECKS}[check](run, steps)
    if check != "completed":
        # A run that a known issue stops before it completes cannot be checked further; that
        # is the same known issue, not a new failure (and not a pass).
        completed_verdict, _ = verdict("completed", run, steps)
        if completed_verdict.status == "known":
            return known_issues.Verdict(
                "known", f"not checkable: the run stopped early ({completed_verdict.message})",
                completed_verdict.issues, completed_verdict.inherited_from), outcome
    return known_issues.judge(check, outcome.problem, outcome.observed, run.spec.all_workarounds,
                              **run.where()), outcome


def completed_or_known(run: RunResult, steps: int) -> RunResult:
    """``run``, if it completed ``steps`` steps; an xfail naming the known issue that stopped it;
    otherwise a failure saying what went wrong (for tests that read a run's steps)."""
    result, outcome = verdict("completed", run, steps)
    known_issues.settle(result, outcome.problem, run.describe())
    return run


def verdicts(run: RunResult, steps: int, checks=None) -> dict[str, tuple[known_issues.Verdict, Outcome]]:
    return {name: verdict(name, run, steps) for name in (checks or RUN_CHECKS)}


# ---------------------------------------------------------------------------------------------
# Verdicts as the tests computed them: the run report reads these, never judges again
# ---------------------------------------------------------------------------------------------

# The checks that read a run's checkpoints (dump/checkpoint); once each has recorded its verdict,
# a full-size run's checkpoints (an HF export of 8 GB for Qwen3-4B in bfloat16) are deleted.
CHECKPOINT_READERS = ("hf_checkpoint_complete",)


def record(check: str, run: RunResult, result: known_issues.Verdict, outcome: Outcome) -> Path:
    """Keep ``check``'s verdict on ``run`` beside the run (any process of the session may have
    computed it), then free what no check still needs (``release_checkpoints``)."""
    path = dump_layout.verdict_file(run.run_dir, check)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"status": result.status, "message": result.message,
                "issues": [i.name for i in result.issues], "inherited_from": result.inherited_from,
                "problem": outcome.problem, "observed": outcome.observed, "how": outcome.how}
    path.write_text(json.dumps(document, indent=2, default=str))
    release_checkpoints(run)
    return path


def recorded(run: RunResult) -> dict[str, tuple[known_issues.Verdict, Outcome]]:
    """Every verdict recorded for ``run`` in this session, by check name."""
    out = {}
    for check, path in dump_layout.verdict_files(run.run_dir).items():
        data = json.loads(path.read_text())
        issues = tuple(known_issues.issue(name) for name in data["issues"])
        out[check] = (known_issues.Verdict(data["status"], data["message"], issues,
                                               data["inherited_from"]),
                          Outcome(data["problem"], data["observed"], data["how"]))
    return out


def release_checkpoints(run: RunResult, readers_done: bool = False) -> bool:
    """Delete a full-size run's checkpoints once every ``CHECKPOINT_READERS`` check has recorded
    its verdict, or the session is over (``readers_done``), unless ``HARNESS_KEEP_CHECKPOINTS``
    is set: at most one full-size export is on disk at a time, whatever order the checks run
    in. True when they were deleted."""
    done = readers_done or all(dump_layout.verdict_file(run.run_dir, check).is_file()
                               for check in CHECKPOINT_READERS)
    if run.spec.size != "full" or not done or os.environ.get(environment.KEEP_CHECKPOINTS):
        return False
    remove_checkpoints(run.run_dir)
    return True


def judge_and_record(check: str, run: RunResult, steps: int) -> tuple[known_issues.Verdict, Outcome]:
    """``check``'s verdict on ``run``, recorded for the run report (``record``); a test ends on
    it with ``known_issues.settle``."""
    result, outcome = verdict(check, run, steps)
    record(check, run, result, outcome)
    return result, outcome

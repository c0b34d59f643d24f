"""Run-level checks of the state beyond the weights, on what launched runs left
(harness/results/training_state.py reads it): tied embeddings (``tie_findings``), MoE load
balancing step by step (``balance_findings``) and through a checkpoint (``expert_bias_findings``),
a resumed run against the uninterrupted one (``resume_findings``) and the state a resumed
trainer holds against the saved checkpoint (``resumed_state_findings``). Each returns its
findings, empty when nothing is broken; a finding of the load-balancing and resume checks starts
with its ``[kind]`` (``finding_kinds``), the observation a known defect is judged by.
Used by tests/e2e/test_training_state.py and tests/parity/test_layout_resharded_resume.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from harness.registry import dump_layout
from harness.results import training_state as state

# What a finding of the load-balancing and resume checks is about (its ``[kind]`` prefix): the
# observation a known load-balancing defect is judged by (``finding_kinds``).
BIAS_NOT_UPDATED = "bias not updated"
BIAS_UPDATE_WRONG = "bias update wrong"
BIAS_NOT_APPLIED = "bias not applied in routing"
BIAS_MOVED_BETWEEN_STEPS = "bias changed between steps"
COUNTS_NOT_RESET = "counts not reset"
COUNTS_NOT_CHOICES = "counts not the router's choices"
NOT_EXERCISED = "balancing not exercised"
CHECKPOINT = "bias not checkpointed or restored"
RESUME = "resumed run differs"


def finding_kinds(findings: list[str]) -> tuple[str, ...]:
    """The sorted distinct ``[kind]`` prefixes of findings."""
    return tuple(sorted({f[1:f.index("]")] for f in findings if f.startswith("[") and "]" in f}))


# ---- tied embeddings -------------------------------------------------------------------------

def tie_findings(run_dir: str | Path, step: int,
                 phases=("built", "loaded", "trained")) -> list[str]:
    """What breaks "the tied embedding is one tensor" in a run of a tied model: in every rank's
    trainer at every phase, the embedding and the output projection must be one parameter (one
    storage, equal values); the saved HF checkpoint must hold no separate ``lm_head.weight``, or
    one bitwise equal to ``model.embed_tokens.weight``."""
    found = []
    records = dump_layout.rank_state_records(run_dir)
    if not records:
        found.append("no rank-side state records (was the run instrumented?)")
    for rank, record in records.items():
        for phase in phases:
            if phase not in record:
                found.append(f"rank {rank}: no {phase!r} record")
                continue
            for i, part in enumerate(record[phase]["parts"]):
                for key in ("weight_tying_flag", "tied_same_parameter", "tied_same_storage",
                            "tied_values_equal"):
                    if part.get(key) is not True:
                        found.append(f"rank {rank} {phase} (step {record[phase]['step']}) "
                                     f"part {i}: {key} = {part.get(key)}")
    saved = dump_layout.saved_hf_tensors(run_dir, step)
    emb = saved.get("model.embed_tokens.weight")
    if emb is None:
        found.append("saved HF checkpoint lacks model.embed_tokens.weight")
    elif "lm_head.weight" in saved and not torch.equal(saved["lm_head.weight"], emb):
        head = saved["lm_head.weight"]
        n = int((head != emb).sum()) if head.shape == emb.shape else head.numel()
        found.append(f"saved HF checkpoint: lm_head.weight differs from embed_tokens "
                     f"({n} of {head.numel()} elements)")
    return found


# ---- MoE load balancing ----------------------------------------------------------------------

def expected_bias_update(counts: torch.Tensor, coeff: float) -> torch.Tensor:
    """Aux-loss-free load balancing (arXiv 2408.15664, as torchtitan documents it): each
    expert's bias moves by ``coeff`` towards balance, up for an expert chosen less than the
    mean count, down for one chosen more, and the update is centred (it sums to zero).
    ``counts``: the expert choices of the step over every data-parallel rank."""
    delta = coeff * torch.sign(counts.mean() - counts)
    return delta - delta.mean()


def balance_findings(records: dict[int, list[dict]]) -> list[str]:
    """What breaks MoE load balancing in a run's records: on every rank, step and MoE layer,
    the routing counts torchtitan accumulates (``tokens_per_expert_E`` before the optimizer
    step) are the step's own router choices (accumulated, and reset after each update); the
    router's choices are the top-k of its scores plus the layer's ``expert_bias_E`` (the bias
    is applied); the bias moves by exactly :func:`expected_bias_update` of the choices summed
    over the ranks, and nothing else moves it between steps; at least one update is not zero.
    Each finding starts with its ``[kind]``."""
    found: list[str] = []
    if not records:
        return [f"[{NOT_EXERCISED}] no load-balancing records (was the run instrumented, and is "
                "the model MoE?)"]
    ranks = sorted(records)
    n_steps = {r: len(records[r]) for r in ranks}
    if len(set(n_steps.values())) != 1 or not n_steps[ranks[0]]:
        return [f"[{NOT_EXERCISED}] optimizer steps recorded per rank differ or are none: {n_steps}"]
    moved = False
    for s in range(n_steps[ranks[0]]):
        step = records[ranks[0]][s]["step"]
        for name in records[ranks[0]][s]["layers"]:
            per_rank = {r: records[r][s]["layers"][name] for r in ranks}
            if any(rec["bias_before"] is None for rec in per_rank.values()):
                found.append(f"[{NOT_EXERCISED}] step {step} {name}: no expert_bias_E (load "
                             "balancing off)")
                continue
            for r, rec in per_rank.items():
                where = f"step {step} rank {r} {name}"
                if rec["hist"] is None:
                    found.append(f"[{NOT_EXERCISED}] {where}: the router never ran")
                    continue
                previous = records[r][s - 1]["layers"][name] if s else None
                if not torch.equal(rec["counts_before"], rec["hist"]):
                    kept = previous is not None and torch.equal(
                        rec["counts_before"], previous["counts_after"] + rec["hist"])
                    found.append(f"[{COUNTS_NOT_RESET if kept else COUNTS_NOT_CHOICES}] {where}: "
                                 f"tokens_per_expert_E before the update "
                                 f"{rec['counts_before'].tolist()} != this step's router choices "
                                 f"{rec['hist'].tolist()}")
                if rec["mismatched"]:
                    found.append(f"[{BIAS_NOT_APPLIED}] {where}: {rec['mismatched']} of "
                                 f"{rec['tokens']} tokens' experts are not the top-k of scores + "
                                 "expert_bias_E")
                if rec["counts_after"].abs().sum() != 0:
                    found.append(f"[{COUNTS_NOT_RESET}] {where}: tokens_per_expert_E not reset by "
                                 f"the update ({rec['counts_after'].tolist()})")
                if previous is not None and not torch.equal(rec["bias_before"], previous["bias_after"]):
                    found.append(f"[{BIAS_MOVED_BETWEEN_STEPS}] {where}: expert_bias_E changed "
                                 "between optimizer steps")
            rec0 = per_rank[ranks[0]]
            if any(rec["hist"] is None for rec in per_rank.values()):
                continue
            counts = sum(rec["hist"] for rec in per_rank.values())
            delta = expected_bias_update(counts, rec0["coeff"])
            want = rec0["bias_before"] + delta
            moved = moved or bool(delta.abs().sum() > 0)
            for r, rec in per_rank.items():
                if not torch.equal(rec["bias_after"], want):
                    got = rec["bias_after"] - rec["bias_before"]
                    kind = BIAS_NOT_UPDATED if not got.abs().sum() > 0 else BIAS_UPDATE_WRONG
                    found.append(f"[{kind}] step {step} rank {r} {name}: expert_bias_E moved by "
                                 f"{got.tolist()}, expected {delta.tolist()} from the choices "
                                 f"{counts.tolist()} (coeff {rec0['coeff']})")
    if not moved:
        found.append(f"[{NOT_EXERCISED}] no step's choices were unbalanced: the update was never "
                     "exercised")
    return found


def expert_bias_findings(first, second, k: int, steps: int) -> list[str]:
    """What breaks MoE load balancing through a checkpoint: run ``second`` resumed from the
    step-``k`` checkpoint of ``first``, whose last full checkpoint is at step ``steps``. The
    ``expert_bias`` buffers moved by step ``k`` and again by ``steps``; the step-``k`` checkpoint
    holds the bias every rank's trainer had after step ``k``'s update; every rank of the resumed
    trainer holds it right after the load. Each finding starts with its ``[kind]``."""
    found = []
    saved_k = state.expert_bias(state.load_dcp(dump_layout.checkpoint_dir(first.run_dir, k)))
    saved_end = state.expert_bias(state.load_dcp(dump_layout.checkpoint_dir(first.run_dir, steps)))
    if not saved_k:
        return [f"[{CHECKPOINT}] no expert_bias in the step-{k} checkpoint"]
    for key, value in saved_k.items():
        if not value.abs().sum() > 0:
            found.append(f"[{BIAS_NOT_UPDATED}] {key}: still zero after {k} steps")
        if torch.equal(value, saved_end.get(key)):
            found.append(f"[{BIAS_NOT_UPDATED}] {key}: unchanged between step {k} and step {steps}")
    # the checkpoint holds the bias the trainer had after step k's update
    records = dump_layout.balance_records(first.run_dir)
    for rank, steps_seen in records.items():
        after_k = {state.canonical_key(n): rec["bias_after"] for s in steps_seen if s["step"] == k
                   for n, rec in s["layers"].items()}
        for key, value in saved_k.items():
            layer = key.rsplit(".expert_bias", 1)[0]
            match = [v for n, v in after_k.items() if n == layer.split("model.", 1)[-1]]
            if not match:
                found.append(f"[{CHECKPOINT}] rank {rank}: no step-{k} record of {layer}")
            elif not torch.equal(match[0], value.float()):
                found.append(f"[{CHECKPOINT}] rank {rank}: checkpoint {key} {value.tolist()} != the trainer's after "
                             f"step {k} {match[0].tolist()}")
    # what the resumed trainer holds right after the load, on every rank
    for rank in range(first.nproc):
        loaded = dump_layout.expert_bias_at(second.run_dir, rank, "loaded")
        loaded = {state.canonical_key(k): v for k, v in loaded.items()}
        for key, value in saved_k.items():
            if key not in loaded:
                found.append(f"[{CHECKPOINT}] rank {rank}: {key} not found after load ({sorted(loaded)})")
            elif not torch.equal(loaded[key], value):
                found.append(f"[{CHECKPOINT}] rank {rank}: {key} after load {loaded[key].tolist()} != saved "
                             f"{value.tolist()}")
    return found


# ---- resume --------------------------------------------------------------------------------

def resume_findings(first, second, k: int, steps: int, full_at: int | None = None) -> list[str]:
    """What keeps run ``second``, resumed from the step-``k`` checkpoint of ``first`` (a run of
    ``steps``), from being ``first`` from there: it logs steps k+1.. and their losses bitwise,
    and its full checkpoint at step ``full_at`` (default: the last) and HF checkpoint at the
    last step, where both runs saved one, equal the uninterrupted run's key by key, bitwise."""
    found = []
    full_at = full_at or steps
    want = {s.step: s.loss for s in first.steps}
    got = {s.step: s.loss for s in second.steps}
    if sorted(got) != list(range(k + 1, steps + 1)):
        found.append(f"[{RESUME}] resumed run logged steps {sorted(got)}, not {k + 1}..{steps}")
    for step, loss in got.items():
        if loss != want.get(step):
            found.append(f"[{RESUME}] step {step}: resumed loss {loss!r} != uninterrupted "
                         f"{want.get(step)!r}")
    diffs = state.differences(state.load_dcp(dump_layout.checkpoint_dir(first.run_dir, full_at)),
                              state.load_dcp(dump_layout.checkpoint_dir(second.run_dir, full_at)))
    found += [f"[{RESUME}] step-{full_at} checkpoint: {d}" for d in diffs[:20]]
    if full_at != steps:
        diffs = state.differences(dump_layout.saved_hf_tensors(first.run_dir, steps),
                                  dump_layout.saved_hf_tensors(second.run_dir, steps))
        found += [f"[{RESUME}] step-{steps} HF checkpoint: {d}" for d in diffs[:20]]
    return found


def rows_differing(held: torch.Tensor, saved: torch.Tensor) -> str:
    """Where two tensors of one shape differ: the rows (first dimension) and the largest
    absolute difference."""
    diff = held != saved
    if held.ndim == 0:
        rows = "the scalar"
    else:
        bad = diff.reshape(diff.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
        rows = f"rows {bad[:8]}{' ...' if len(bad) > 8 else ''} ({len(bad)} of {held.shape[0]})"
    d = ((held.double() - saved.double()).abs().max().item()
         if held.is_floating_point() else "-")
    return f"{rows} differ (max |d| {d})"


# What a resumed trainer's state is compared with: the saved model and optimizer entries (the
# lr schedule, dataloader and train state are checked by the runs' steps and learning rates,
# and the dataloader is not loaded at another data-parallel degree).
NOT_RESUMED_STATE = ("lr_scheduler.", "dataloader.", "train_state.")


def resumed_state_findings(records: dict[int, dict], saved: dict) -> list[str]:
    """What a resumed trainer holds once its own checkpoint load returned (``records``: every
    rank's, harness/registry/dump_layout.py ``resumed_state_records``) against the saved
    checkpoint (``load_dcp`` of it): every model and optimizer entry, tensor for tensor, every
    row, bit for bit (the load is a copy)."""
    if not records:
        return [f"[{RESUME}] no rank recorded its state after the load (was the run resumed, "
                "and instrumented?)"]
    whole, found = state.assembled(records)
    found = [f"[{RESUME}] {p}" for p in found]
    held: dict = {}
    for key, value in whole.items():  # plain values nested as the checkpoint's flattening nests them
        state.flatten(value, key, held)
    wanted = {k for k in saved if not k.startswith(NOT_RESUMED_STATE)}
    for key in sorted(wanted - set(held)):
        found.append(f"[{RESUME}] {key}: saved, not held by the resumed trainer")
    for key in sorted(set(held) - set(saved)):
        found.append(f"[{RESUME}] {key}: held by the resumed trainer, not in the checkpoint")
    for key in sorted(set(held) & set(saved)):
        x, y = held[key], saved[key]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                found.append(f"[{RESUME}] {key}: held {tuple(x.shape)} {x.dtype}, saved "
                             f"{tuple(y.shape)} {y.dtype}")
            elif not torch.equal(x, y):
                found.append(f"[{RESUME}] {key}: {rows_differing(x, y)}")
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            found.append(f"[{RESUME}] {key}: held {x!r}, saved {y!r}")
    return found

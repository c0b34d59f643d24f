"""State beyond the weights: torchtitan DCP checkpoints read back in process, compared key by
key (bitwise), and the MoE load-balancing state (``expert_bias``) picked out of them; and what
breaks tied embeddings and load balancing in the ranks' own records (``tie_findings``,
``balance_findings``; recorded by harness/rank/hooks.py, read by harness/registry/dump_layout.py).

A torchtitan checkpoint folder (``<dump>/checkpoint/step-N``, harness/registry/dump_layout.py
``checkpoint_dir``) is a torch.distributed.checkpoint (DCP) directory; ``load_dcp`` reads it as DCP's own ``dcp_to_torch_save`` does (in memory) and flattens the
nested state (model, optimizer, lr scheduler, dataloader, train state) into dotted keys.
"""

from __future__ import annotations

from pathlib import Path

import torch

from harness.registry import dump_layout


def _flatten(obj, prefix: str, out: dict) -> None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _flatten(value, f"{prefix}.{i}", out)
    else:
        out[prefix] = obj


def load_dcp(folder: str | Path) -> dict:
    """Every entry of a DCP checkpoint folder, flattened to dotted keys."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    folder = Path(folder)
    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(f"{folder}: not a DCP checkpoint (no .metadata)")
    # what DCP's dcp_to_torch_save reads (the same planner, no process group), kept in memory
    # instead of written to a file and read back
    state: dict = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(folder)),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    flat: dict = {}
    _flatten(state, "", flat)
    return flat


def canonical_key(key: str) -> str:
    """A model key as the checkpoint spells it: without the rank records' ``part<i>.`` prefix
    and the activation-checkpoint wrapper's ``_checkpoint_wrapped_module.`` segment."""
    parts = key.split(".")
    if parts and parts[0].startswith("part") and parts[0][4:].isdigit():
        parts = parts[1:]
    return ".".join(p for p in parts if p != "_checkpoint_wrapped_module")


def expert_bias(state: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if "expert_bias" in k and isinstance(v, torch.Tensor)}


def differences(a: dict, b: dict, *, ignore: tuple[str, ...] = ()) -> list[str]:
    """Keys missing on one side or not bitwise equal (``ignore``: substrings of keys to skip)."""
    out = []
    keys = sorted(set(a) | set(b))
    for key in keys:
        if any(s in key for s in ignore):
            continue
        if key not in a or key not in b:
            out.append(f"{key}: only in {'first' if key in a else 'second'}")
            continue
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                out.append(f"{key}: tensor vs {type(y if isinstance(x, torch.Tensor) else x)}")
            elif x.shape != y.shape or x.dtype != y.dtype:
                out.append(f"{key}: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}")
            elif not torch.equal(x, y):
                d = (x.double() - y.double()).abs().max() if x.is_floating_point() else "-"
                out.append(f"{key}: differs (max |d| {d})")
        elif x != y:
            out.append(f"{key}: {x!r} vs {y!r}")
    return out


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


# What a finding of balance_findings / expert_bias_findings is about (its ``[kind]`` prefix): the
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


# ---- resharded resume ------------------------------------------------------------------------

def write_whole_copy(folder: str | Path, out: str | Path) -> Path:
    """``folder``'s DCP checkpoint written again with every tensor as one whole chunk, as a run
    of one rank holds it: the same keys, values and nesting (read with DCP's own reader, written
    with DCP's own writer, no process group), so loading it reshards nothing a run saved over
    several ranks. Written once (to a temporary sibling, then renamed); returns ``out``."""
    import os
    import shutil
    import warnings

    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    out = Path(out)
    if (out / ".metadata").is_file():
        return out
    state: dict = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(folder)),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp_save(state, storage_writer=FileSystemWriter(str(tmp)), no_dist=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(out)
    except OSError:  # another worker wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def chunks_per_tensor(folder: str | Path) -> dict[str, tuple[tuple[int, ...], int]]:
    """Per tensor of a DCP checkpoint: (its global shape, the chunks it was saved in)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(folder)).read_metadata()
    return {key: (tuple(m.size), len(m.chunks)) for key, m in meta.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)}


def uneven_tensors(folder: str | Path, ranks: int) -> dict[str, int]:
    """The tensors a run saved sharded (more than one chunk) whose first dimension does not
    split evenly over ``ranks``: the dimension FSDP shards, with a shorter last shard."""
    return {key: shape[0] for key, (shape, chunks) in chunks_per_tensor(folder).items()
            if chunks > 1 and shape and shape[0] % ranks}


# ---- the state a resumed trainer holds, against the state that was saved ---------------------

def assembled(records: dict[int, dict]) -> tuple[dict, list[str]]:
    """Whole tensors from every rank's ``(local shard, global offset, global shape)`` records
    (harness/rank/hooks.py ``_placed``; a plain tensor or value as every rank holds it), and
    what keeps a tensor from being whole: elements no rank holds, or two ranks holding
    different values for one element or one plain value."""
    whole: dict = {}
    covered: dict = {}
    problems: list[str] = []
    for rank, record in sorted(records.items()):
        for key, value in record.items():
            if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], torch.Tensor):
                local, offset, shape = value
                if offset is None:  # a plain tensor: every rank holds all of it
                    offset = (0,) * local.ndim
                if key not in whole:
                    whole[key] = torch.zeros(shape, dtype=local.dtype)
                    covered[key] = torch.zeros(shape, dtype=torch.bool)
                region = tuple(slice(o, o + n) for o, n in zip(offset, local.shape))
                held, seen = whole[key][region], covered[key][region]
                if seen.any() and (seen & (held != local)).any():
                    problems.append(f"{key}: rank {rank} holds other values than a rank before it "
                                    f"in the region at offset {offset}")
                held.copy_(local)
                seen.fill_(True)
            elif key not in whole:
                whole[key] = value
            elif whole[key] != value:
                problems.append(f"{key}: rank {rank} holds {value!r}, a rank before it {whole[key]!r}")
    for key, seen in covered.items():
        if not seen.all():
            missing = int((~seen).sum())
            problems.append(f"{key}: {missing} of {seen.numel()} elements held by no rank")
    return whole, problems


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
    whole, found = assembled(records)
    found = [f"[{RESUME}] {p}" for p in found]
    held: dict = {}
    for key, value in whole.items():  # plain values nested as the checkpoint's flattening nests them
        _flatten(value, key, held)
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


# ---- gradients -------------------------------------------------------------------------------

def first_step_grads(run_dir: str | Path) -> tuple[int | None, dict[str, torch.Tensor], list[str]]:
    """A run's first trained step, every parameter's whole gradient of it (before clipping,
    assembled from every rank's shard: harness/rank/hooks.py ``record_first_step_grads``; keys
    as the checkpoint spells them, ``canonical_key``), and what kept a gradient from being whole."""
    records = dump_layout.grad_records(run_dir)
    steps = {rec["step"] for rec in records.values()}
    grads, problems = assembled({rank: {canonical_key(k): v for k, v in rec["grads"].items()}
                                 for rank, rec in records.items()})
    if len(steps) > 1:
        problems.append(f"the ranks recorded different steps: {sorted(steps)}")
    return (steps.pop() if len(steps) == 1 else None), grads, problems


def gradient_deltas(mine: dict, theirs: dict) -> dict[str, float]:
    """Per parameter, the size of the difference relative to the other run's gradient:
    ``|mine - theirs| / |theirs|`` (Frobenius norms; inf where a parameter is on one side only
    or its shapes differ)."""
    out = {}
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key), theirs.get(key)
        if a is None or b is None or a.shape != b.shape:
            out[key] = float("inf")
            continue
        a, b = a.double(), b.double()
        scale = b.norm().item()
        out[key] = (a - b).norm().item() / scale if scale else (0.0 if torch.equal(a, b) else float("inf"))
    return out

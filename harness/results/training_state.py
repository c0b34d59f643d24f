"""State beyond the weights, as a run left it: torchtitan DCP checkpoints read back in process,
compared key by key (bitwise), and the MoE load-balancing state (``expert_bias``) picked out of
them; whole tensors assembled from the ranks' records of their shards (recorded by
harness/rank/hooks.py, read by harness/registry/dump_layout.py). What breaks tied embeddings,
load balancing and a resume in them is judged by harness/checks/training_state.py.

A torchtitan checkpoint folder (``<dump>/checkpoint/step-N``, harness/registry/dump_layout.py
``checkpoint_dir``) is a torch.distributed.checkpoint (DCP) directory; ``load_dcp`` reads it as
DCP's own ``dcp_to_torch_save`` does (in memory) and flattens the nested state (model,
optimizer, lr scheduler, dataloader, train state) into dotted keys.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import save as dcp_save
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from harness.registry import dump_layout


def flatten(obj, prefix: str, out: dict) -> None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            flatten(value, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            flatten(value, f"{prefix}.{i}", out)
    else:
        out[prefix] = obj


def load_dcp(folder: str | Path) -> dict:
    """Every entry of a DCP checkpoint folder, flattened to dotted keys."""
    folder = Path(folder)
    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(f"{folder}: not a DCP checkpoint (no .metadata)")
    # what DCP's dcp_to_torch_save reads (the same planner, no process group), kept in memory
    # instead of written to a file and read back
    state: dict = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(folder)),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    flat: dict = {}
    flatten(state, "", flat)
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


# ---- resharded resume ------------------------------------------------------------------------

def write_whole_copy(folder: str | Path, out: str | Path) -> Path:
    """``folder``'s DCP checkpoint written again with every tensor as one whole chunk, as a run
    of one rank holds it: the same keys, values and nesting (read with DCP's own reader, written
    with DCP's own writer, no process group), so loading it reshards nothing a run saved over
    several ranks. Written once (to a temporary sibling, then renamed); returns ``out``."""
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
    meta = FileSystemReader(str(folder)).read_metadata()
    return {key: (tuple(m.size), len(m.chunks)) for key, m in meta.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)}


def uneven_tensors(folder: str | Path, ranks: int) -> dict[str, int]:
    """The tensors a run saved sharded (more than one chunk) whose first dimension does not
    split evenly over ``ranks``: the dimension FSDP shards, with a shorter last shard."""
    return {key: shape[0] for key, (shape, chunks) in chunks_per_tensor(folder).items()
            if chunks > 1 and shape and shape[0] % ranks}


# ---- whole tensors from the ranks' shards ------------------------------------------------------

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
                region = tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))
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

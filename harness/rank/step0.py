"""What a launched run's ranks record about step 0, and the check on the shard fingerprints.
Observers only (installed in every launched rank by harness/rank/observers.py); the paths are
harness/registry/dump_layout.py's, which reads them back.

- the step-0 weights of a random-init run (``dump_initial``), under torchtitan's names, one
  file per unit (embedding, each layer, final norm, head), written by rank 0 after every rank
  gathered its shards, so memory stays that of one layer; models over ``MAX_PARAMS`` are not
  dumped;
- every rank's fingerprint of each parameter's local shard, as step 1 starts from it (after
  init, and after the checkpoint load of a pretrained run; ``write_fingerprints``): its mesh
  coordinate on the sharded mesh dimensions, shape, a hash of its bytes, float64 sum and sum
  of squares, a few fixed-index samples, whether all its values are equal. One pass over the
  local shard, no collective: cheap at every size (``identical_shards`` judges them);
- every rank's batch of a step (``dump_batch``), as the trainer received it and as
  ``post_dataloading_process`` makes it (what the model and the loss are fed).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace

from harness.registry import dump_layout

MAX_PARAMS = 200_000_000  # a larger model is not dumped (a 4B random init would be 16 GB)
SAMPLES = 4  # fixed flat indices per shard: 0, n/4, n/2, 3n/4
CHECKPOINT_WRAPPER = "_checkpoint_wrapped_module."  # activation checkpointing's, not in names users know


def rank_of_process() -> int:
    import torch.distributed as dist  # noqa: PLC0415  heavy: torch; the launcher imports step0 without it

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def plain(t):
    """A detached, whole (gathered), plain CPU copy of ``t`` (a DTensor or a tensor)."""
    import torch  # noqa: PLC0415  heavy: torch; the launcher imports step0 without it

    t = t.detach()
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    return t.cpu().clone()


# ------------------------------------------------------------------ shard fingerprints

def fingerprint(param) -> dict:
    """The fingerprint of this rank's local shard of ``param`` (a DTensor or a plain tensor)."""
    import torch  # noqa: PLC0415  heavy: torch; the launcher imports step0 without it

    local = param.detach()
    placements, coordinate = None, None
    if hasattr(local, "to_local"):
        placements = [str(p) for p in local.placements]
        coord = local.device_mesh.get_coordinate()
        # The rank's place among the shards: its coordinate on the mesh dimensions that
        # shard this parameter (ranks differing only on a replicating dimension hold the
        # same shard by design).
        coordinate = [None if coord is None else coord[i]
                      for i, p in enumerate(local.placements) if p.is_shard()]
        local = local.to_local()
    local = local.cpu().contiguous().reshape(-1)
    n = local.numel()
    out = {"global_shape": list(param.shape), "local_numel": n, "dtype": str(param.dtype).removeprefix("torch."),
           "placements": placements, "shard_coordinate": coordinate}
    if n == 0:
        return {**out, "empty": True}
    if type(local) is not torch.Tensor:
        local = local.as_subclass(torch.Tensor)
    out.update(
        empty=False,
        sha1=hashlib.sha1(local.view(torch.uint8).numpy().tobytes()).hexdigest(),
        sum=float(torch.sum(local, dtype=torch.float64)),
        sum_sq=float(torch.sum(local.double().square()) if local.is_floating_point() else 0.0),
        samples=[float(local[(i * n) // SAMPLES]) for i in range(SAMPLES)],
        constant=bool((local == local[0]).all()),
    )
    return out


def write_fingerprints(trainer) -> None:
    """This rank's fingerprints of every parameter's local shard."""
    params = {}
    for i, part in enumerate(trainer.model_parts):
        prefix = f"part{i}." if len(trainer.model_parts) > 1 else ""
        for name, param in part.named_parameters():
            params[prefix + name.replace(CHECKPOINT_WRAPPER, "")] = fingerprint(param)
    import torch.distributed as dist  # noqa: PLC0415  heavy: torch; the launcher imports step0 without it

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    path = dump_layout.shard_file(trainer.config.dump_folder, rank_of_process())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(
        {"rank": rank_of_process(), "world": world, "step": int(trainer.step), "params": params}, indent=0))


def identical_shards(by_rank: dict[int, dict]) -> tuple[list[str], list[str]]:
    """(checked, identical): the parameters whose shards are expected to differ across ranks
    (sharded, non-empty, not constant on every rank), and those of them of which two ranks at
    different places among the shards hold byte-identical shards."""
    names = sorted(set().union(*(r["params"] for r in by_rank.values())))
    checked, identical = [], []
    for name in names:
        shards = [r["params"][name] for r in by_rank.values() if name in r["params"]]
        shards = [s for s in shards if s["placements"] and s["shard_coordinate"] and not s["empty"]]
        if len({tuple(map(str, s["shard_coordinate"])) for s in shards}) < 2:
            continue  # replicated, or one shard only
        if all(s["constant"] for s in shards):
            continue  # constant by design (norm weights of ones, zero biases)
        checked.append(name)
        seen: dict[str, tuple] = {}
        for s in shards:
            place = tuple(map(str, s["shard_coordinate"]))
            if s["sha1"] in seen and seen[s["sha1"]] != place:
                identical.append(name)
                break
            seen.setdefault(s["sha1"], place)
    return checked, identical


# ------------------------------------------------------------------ step-0 weights

def _unit(name: str) -> str:
    parts = name.split(".")
    return f"{parts[0]}.{parts[1]}" if parts[0] == "layers" else parts[0]


def dump_initial(trainer) -> None:
    """The model's step-0 weights. Every rank takes part (a sharded parameter is gathered);
    rank 0 writes, one unit at a time, so memory stays that of one layer."""
    import torch  # noqa: PLC0415  heavy: torch; the launcher imports step0 without it

    dump = trainer.config.dump_folder
    rank = rank_of_process()
    model = trainer.model_parts[0]
    named = list(model.state_dict().items())
    if sum(t.numel() for _, t in named) > MAX_PARAMS:
        return
    if rank == 0:
        dump_layout.initial_folder(dump).mkdir(parents=True, exist_ok=True)
    units: dict[str, dict] = {}
    for name, tensor in named:
        t = tensor.detach()
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        if rank == 0:
            units.setdefault(_unit(name), {})[name] = t.cpu().clone()
            if len(units) > 1:  # the previous unit is complete
                done = next(iter(units))
                torch.save(units.pop(done), dump_layout.initial_file(dump, done))
    if rank == 0:
        for unit, tensors in units.items():
            torch.save(tensors, dump_layout.initial_file(dump, unit))


# ------------------------------------------------------------------ the batches

def dump_batch(trainer, input_dict, labels, processed) -> None:
    """This rank's batch of the trainer's current step: as the dataloader gave it and as
    ``post_dataloading_process`` made it (what the model and the loss are fed)."""
    import torch  # noqa: PLC0415  heavy: torch; the launcher imports step0 without it

    from harness.references.batch import Batch  # noqa: PLC0415  heavy: torch; the launcher imports step0 without it
    from harness.upstream import titan_api  # noqa: PLC0415  heavy: torchtitan; the launcher imports step0 without it

    inputs, model_labels, extra = titan_api.post_dataloading_parts(processed)
    path = dump_layout.batch_file(trainer.config.dump_folder, rank_of_process(), int(trainer.step))
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = replace(Batch.from_loader(input_dict, labels),
                    fed=Batch(inputs, extra.get("positions"), model_labels)).apply(plain)
    # Under gradient accumulation a step is several microbatches: the step's dump holds all
    # their rows, in the order the trainer fed them.
    if getattr(trainer, "_harness_dumped_step", None) == int(trainer.step):
        batch = Batch.cat([Batch.from_dump(torch.load(path)), batch])
    trainer._harness_dumped_step = int(trainer.step)
    torch.save(batch.to_dump(), path)

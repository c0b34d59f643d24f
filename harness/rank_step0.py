"""What a launched run's ranks leave about step 0, under the run's dump folder, and how the
shard fingerprints are read back. One hook (``install``), installed in every launched rank:
by the harness's ``sitecustomize`` (harness/upstream/boot, ``install_in_rank``) wherever the
boot folder is on the ranks' path, and by every registered backend's config function
(harness/backends/common.py ``install_rank_step0``), so a trn2 run, whose ranks get no shims,
leaves it too. It observes only.

- ``harness_batches/rank{R}_step1.pt``: every rank's step-1 batch as the trainer received it
  (``input``, ``positions`` or None, ``labels``) and as ``post_dataloading_process`` makes it
  (``model_input``, ``model_labels``, ``model_positions``): the layout harness/data/
  loss_reference.py ``load_batches`` reads (full-size runs' HF-forward expectation) and
  harness/diagnosis/rank_dump.py ``first_batch`` falls back to. Not written where the data-path
  hooks (harness/data/rank_hooks.py) are installed: they write the same files, for more steps.
- ``harness_initial/native_rank0_<unit>.pt``: a random-init run's step-0 weights under
  torchtitan's names, one file per unit (embedding, each layer, final norm, head), written by
  rank 0 after every rank gathered its shards, so memory stays that of one layer; models over
  ``MAX_PARAMS`` are not dumped (read by harness/diagnosis/rank_dump.py).
- ``harness_step0/shards_rank{R}.json``: every rank's fingerprint of each parameter's local
  shard, as step 1 starts from it (after init, and after the checkpoint load of a pretrained
  run): its mesh coordinate on the sharded mesh dimensions, shape, a hash of its bytes, float64
  sum and sum of squares, a few fixed-index samples, whether all its values are equal. One pass
  over the local shard, no collective: cheap at every size (``identical_shards`` reads them).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

BATCHES = "harness_batches"
BATCH_FILE = "rank{rank}_step{step}.pt"
INITIAL = "harness_initial"
NATIVE = "native_rank0_{unit}.pt"  # one file per unit (embedding, each layer, norm, head)
MAX_PARAMS = 200_000_000  # a larger model is not dumped (a 4B random init would be 16 GB)
SHARDS = "harness_step0"
SHARD_FILE = "shards_rank{rank}.json"
SAMPLES = 4  # fixed flat indices per shard: 0, n/4, n/2, 3n/4
CHECKPOINT_WRAPPER = "_checkpoint_wrapped_module."  # activation checkpointing's, not in names users know


def rank_of_process() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def plain(t):
    """A detached, whole (gathered), plain CPU copy of ``t`` (a DTensor or a tensor)."""
    import torch

    t = t.detach()
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    return t.cpu().clone()


# ------------------------------------------------------------------ shard fingerprints

def fingerprint(param) -> dict:
    """The fingerprint of this rank's local shard of ``param`` (a DTensor or a plain tensor)."""
    import torch

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


def _write_fingerprints(trainer) -> None:
    folder = Path(trainer.config.dump_folder) / SHARDS
    folder.mkdir(parents=True, exist_ok=True)
    params = {}
    for i, part in enumerate(trainer.model_parts):
        prefix = f"part{i}." if len(trainer.model_parts) > 1 else ""
        for name, param in part.named_parameters():
            params[prefix + name.replace(CHECKPOINT_WRAPPER, "")] = fingerprint(param)
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    (folder / SHARD_FILE.format(rank=rank_of_process())).write_text(json.dumps(
        {"rank": rank_of_process(), "world": world, "step": int(trainer.step), "params": params}, indent=0))


def read_fingerprints(run_dir: Path) -> dict[int, dict] | None:
    """rank -> its fingerprints (``None`` when the run left none)."""
    files = sorted((Path(run_dir) / "dump" / SHARDS).glob(SHARD_FILE.format(rank="*")))
    if not files:
        return None
    out = {}
    for path in files:
        record = json.loads(path.read_text())
        out[int(record["rank"])] = record
    return out


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


def _dump_initial(trainer) -> None:
    """Every rank takes part (a sharded parameter is gathered); rank 0 writes, one unit at a
    time, so memory stays that of one layer."""
    import torch

    folder = Path(trainer.config.dump_folder) / INITIAL
    rank = rank_of_process()
    model = trainer.model_parts[0]
    named = list(model.state_dict().items())
    if sum(t.numel() for _, t in named) > MAX_PARAMS:
        return
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    units: dict[str, dict] = {}
    for name, tensor in named:
        t = tensor.detach()
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        if rank == 0:
            units.setdefault(_unit(name), {})[name] = t.cpu().clone()
            if len(units) > 1:  # the previous unit is complete
                done = next(iter(units))
                torch.save(units.pop(done), folder / NATIVE.format(unit=done))
    if rank == 0:
        for unit, tensors in units.items():
            torch.save(tensors, folder / NATIVE.format(unit=unit))


# ------------------------------------------------------------------ the step-1 batch

def dump_batch(trainer, input_dict, labels, processed) -> None:
    """This rank's batch of the trainer's current step: as the dataloader gave it and as
    ``post_dataloading_process`` made it (what the model and the loss are fed)."""
    import torch

    from harness import titan_api

    inputs, model_labels, extra = titan_api.post_dataloading_parts(processed)
    folder = Path(trainer.config.dump_folder) / BATCHES
    folder.mkdir(parents=True, exist_ok=True)
    positions, model_positions = input_dict.get("positions"), extra.get("positions")
    torch.save({
        "input": plain(input_dict["input"]),
        "positions": None if positions is None else plain(positions),
        "labels": plain(labels),
        "model_input": plain(inputs),
        "model_labels": plain(model_labels),
        "model_positions": None if model_positions is None else plain(model_positions),
    }, folder / BATCH_FILE.format(rank=rank_of_process(), step=int(trainer.step)))


# ------------------------------------------------------------------ the hook

def install(trainer_module) -> None:
    """Patch ``trainer_module.Trainer`` (idempotent): the step-0 weights of a random-init run
    right after the trainer built and initialised them; at step 1, before the batch reaches
    the model, the shard fingerprints and every rank's batch."""
    cls = trainer_module.Trainer
    if getattr(cls, "_harness_rank_step0", False):
        return
    cls._harness_rank_step0 = True
    original_init = cls.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if not getattr(self.config.checkpoint, "initial_load_path", None):
            _dump_initial(self)
        post = self.post_dataloading_process

        def step1(input_dict, labels, *rest, **kw):
            if self.step != 1:
                return post(input_dict, labels, *rest, **kw)
            if not getattr(self, "_harness_fingerprinted", False):  # once, whatever the microbatches
                self._harness_fingerprinted = True
                _write_fingerprints(self)
            processed = post(input_dict, labels, *rest, **kw)
            if not getattr(type(self), "_harness_data_hooks", False):
                dump_batch(self, input_dict, labels, processed)
            return processed

        self.post_dataloading_process = step1

    cls.__init__ = __init__


def install_in_rank() -> None:
    """``install`` right after ``torchtitan.trainer`` is imported, on top of whatever other
    post-import patches (shims, plants) that module gets (post-import hooks chain)."""
    from harness.upstream.install import after_import

    after_import("torchtitan.trainer", install)

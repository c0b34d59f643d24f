"""Workaround (opt-in): draw each FSDP-sharded parameter's init as the whole tensor, keep the
rank's shard.

Defect (torch 2.14.0 ``torch/distributed/tensor/_random.py`` ``is_rng_supported_mesh``, with
torchtitan's ``Module._init_param`` in ``protocols/module.py``, both generations): DTensor's
RNG tracker, which makes a random op on a sharded DTensor draw each shard's own part of the
whole tensor's stream, exists only for devices whose torch module has ``set_rng_state``
(CUDA-like). On a CPU mesh it warns ("DTensor random operators may not have complete support
on cpu device mesh") and runs the op on each local shard. torchtitan seeds every rank alike
(relying on the tracker), so every rank draws the same numbers into its own shard: every
randomly initialised FSDP parameter of a multi-rank CPU run is N copies of one shard.
(The fused QKV init draws whole replicated tensors and is not affected.)

Shim: ``Module._init_param`` runs the parameter's init on a plain tensor of the whole shape
holding the parameter's current values (so an init that skips, such as a tied weight's,
keeps them) and copies the rank's ``Shard(0)`` slice into its local shard. Every rank draws
the same whole tensors, so the ranks' RNG streams stay in step, and the weights are those of a
one-rank init of the same seed. It handles pure FSDP only (every DTensor parameter
``Shard(0)`` on a one-dimensional mesh, the harness's launches) and refuses anything else
(tensor, expert or hybrid-sharded parallelism) with an error naming the parameter. One gather
per parameter at init: meant for the CPU tier's tiny and twin sizes.

Installed by name (``HARNESS_SHIMS=dtensor_full_init``) when a run asks for the workaround
``dtensor_full_init`` (harness/registry/known_issues/). tests/selftest/test_upstream_shims.py notices
when torch no longer needs it.
"""

from __future__ import annotations

from types import ModuleType

SHIM_NAME = "dtensor_full_init"
MODULE = "torchtitan.protocols.module"


def needed_on(device_type: str) -> bool:
    """Whether DTensor's RNG tracker is missing for meshes of ``device_type`` (the defect)."""
    from torch.distributed.device_mesh import _get_device_handle  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

    handle = _get_device_handle(device_type)
    return not (handle and hasattr(handle, "set_rng_state"))


def init_whole_then_shard(name: str, param, init) -> None:
    """``init(param)`` as a whole-tensor draw, the rank keeping its ``Shard(0)`` slice."""
    import torch  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads
    from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

    if not isinstance(param, DTensor):
        init(param)
        return
    mesh, placements = param.device_mesh, tuple(param.placements)
    if mesh.ndim != 1 or placements != (Shard(0),):
        raise NotImplementedError(
            f"workaround {SHIM_NAME}: parameter {name!r} is placed {placements} on a "
            f"{mesh.ndim}-dimensional mesh; it handles pure FSDP only (every parameter "
            f"Shard(0) on one mesh dimension). Run without --workaround {SHIM_NAME} (the "
            "shards_distinct check then reports the identical shards by name)")
    whole = param.full_tensor()
    whole = (whole.wait() if hasattr(whole, "wait") else whole).clone()
    if type(whole) is not torch.Tensor:
        whole = whole.as_subclass(torch.Tensor)
    init(whole)
    local = param.to_local()
    chunks = torch.chunk(whole, mesh.size(), dim=0)  # Shard(0)'s split
    rank = mesh.get_local_rank()
    piece = chunks[rank] if rank < len(chunks) else whole[0:0]
    if piece.shape != local.shape:
        raise RuntimeError(f"workaround {SHIM_NAME}: {name!r}: the rank's slice of the whole "
                           f"tensor is {tuple(piece.shape)}, its local shard {tuple(local.shape)}")
    local.copy_(piece)


def draw_whole_tensors(module_protocol: ModuleType) -> None:
    """Wrap ``module_protocol.Module._init_param`` (idempotent)."""
    cls = module_protocol.Module
    original = cls._init_param
    if getattr(original, "_harness_shim", None) == SHIM_NAME:
        return

    def _init_param(self, name, param):
        init_table = self._param_init
        if init_table is None or name not in init_table:
            return original(self, name, param)  # upstream's own error
        init_whole_then_shard(f"{type(self).__name__}.{name}", param, init_table[name])

    _init_param.__wrapped__ = original
    _init_param._harness_shim = SHIM_NAME
    cls._init_param = _init_param


PATCHES = ((MODULE, draw_whole_tensors),)

"""What the neuron process group refuses, so that its CPU stand-in refuses it too.

torch-neuronx 2.14.3's ``ProcessGroupNeuron`` (torch_neuronx/distributed/backend.py) is a
Python process group over XLA collectives, and it refuses calls that gloo accepts. The
rehearsed night (``HARNESS_NEURON_STANDIN=cpu``) runs the neuron tier's launches on gloo; a
stand-in that accepted what trn2 refuses would pass runs that die on trn2 (expert parallelism
did: torchtitan's token dispatch sends uneven, per-step split lists). So the stand-in's ranks
install these refusals (shim ``neuron_collectives``, harness/upstream/install.py), each one read
from that source, and raise what it raises:

| call (torch API)                          | ProcessGroupNeuron refuses                        |
|-------------------------------------------|---------------------------------------------------|
| ``all_to_all_single`` (1)                 | split sizes other than None, empty, or all 1s (2) |
| ``all_to_all`` (``alltoall``)             | a group whose size does not divide the world size (``ValueError``) |
| ``barrier`` on a group                    | any group but the default one (``NotImplementedError``) |
| ``reduce_scatter`` coalesced              | always (``NotImplementedError``)                  |

(1) c10d ``alltoall_base``; the functional and autograd forms reach the same backend method.
(2) Also a split list whose length is not the group's size (``NotImplementedError``, output
sizes checked before input sizes).

Its own test suite holds the first (tests: ``test_invalid_split_sizes_error`` expects
"Only even split sizes are supported" for ``[2, 1]`` on 2 ranks). The refusals are checked
here as the torch API is called (the functional collectives torchtitan's dispatch imports by
name are patched as they are imported), not inside gloo: what differs from trn2 is listed in
scripts/nightly/rehearse.py DIFFERENCES. Nothing here imports torch at module level.
"""

from __future__ import annotations

from types import ModuleType

SHIM_NAME = "neuron_collectives"
SOURCE = "torch-neuronx 2.14.3 torch_neuronx/distributed/backend.py ProcessGroupNeuron"
EVEN_SPLITS_MESSAGE = "Only even split sizes are supported"


def alltoall_base_refusal(output_split_sizes, input_split_sizes, group_size: int) -> str | None:
    """The error ProcessGroupNeuron.alltoall_base raises for these split sizes, or None: each
    list must be None, empty or all 1s, and as long as the group; output sizes first."""
    for name, sizes in (("output", output_split_sizes), ("input", input_split_sizes)):
        if sizes is None or len(sizes) == 0 or all(int(s) == 1 for s in sizes):
            continue
        if not isinstance(sizes, (list, tuple)):
            return (f"alltoall_base: {name}_split_sizes must be None or a list/tuple, got "
                    f"{type(sizes)}")
        if len(sizes) != group_size:
            return (f"alltoall_base: {name}_split_sizes length ({len(sizes)}) must match "
                    f"group_size ({group_size})")
        return (f"alltoall_base: {EVEN_SPLITS_MESSAGE}. Got {name}_split_sizes: "
                f"{[int(s) for s in sizes]}")
    return None


def alltoall_refusal(world_size: int, group_size: int) -> str | None:
    if world_size % group_size:
        return (f"Cannot create global_replica_group when world_size:{world_size} is not "
                f"divisible by group_size: {group_size}.")
    return None


def barrier_refusal(world_size: int, group_size: int) -> str | None:
    if world_size != group_size:
        return "Barrier is implemented only for default group"
    return None


def _group_size(group) -> int:
    """The size of a c10d group given as torch's collectives take it: None (the world), a
    ProcessGroup, a 1-D DeviceMesh or a group name."""
    import torch.distributed as dist  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads
    from torch.distributed import distributed_c10d as c10d  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

    if group is None:
        return dist.get_world_size()
    if hasattr(group, "size") and callable(group.size) and not isinstance(group, str):
        try:
            return int(group.size())
        except TypeError:
            pass
    if isinstance(group, str):
        return c10d._resolve_process_group(group).size()
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[1], int):
        return int(group[0].size(group[1]))  # (DeviceMesh, dim)
    if isinstance(group, list):
        return len(group[0]) if group and isinstance(group[0], list) else len(group)
    return dist.get_world_size(group)


def _sizes(value):
    """Split sizes as the backend receives them (a tensor of sizes becomes its list)."""
    if value is None:
        return None
    if hasattr(value, "tolist"):
        return value.tolist()
    return list(value)


def refuse_in_c10d(c10d: ModuleType) -> None:
    """``all_to_all_single``, ``all_to_all``, ``barrier`` and the coalesced reduce-scatter of
    torch.distributed refuse what ProcessGroupNeuron refuses."""
    import torch.distributed as dist  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

    single, lists, barrier = c10d.all_to_all_single, c10d.all_to_all, c10d.barrier

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                          group=None, async_op=False):
        problem = alltoall_base_refusal(_sizes(output_split_sizes), _sizes(input_split_sizes),
                                        _group_size(group))
        if problem:
            raise NotImplementedError(problem)
        return single(output, input, output_split_sizes, input_split_sizes, group=group,
                      async_op=async_op)

    def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
        problem = alltoall_refusal(dist.get_world_size(), _group_size(group))
        if problem:
            raise ValueError(problem)
        return lists(output_tensor_list, input_tensor_list, group=group, async_op=async_op)

    def barrier_(group=None, *args, **kwargs):
        problem = barrier_refusal(dist.get_world_size(), _group_size(group))
        if problem:
            raise NotImplementedError(problem)
        return barrier(group, *args, **kwargs)

    def reduce_scatter_coalesced(*args, **kwargs):
        raise NotImplementedError("ProcessGroupNeuron.reduce_scatter_coalesced")

    for name, patched, original in (("all_to_all_single", all_to_all_single, single),
                                    ("all_to_all", all_to_all, lists),
                                    ("barrier", barrier_, barrier)):
        patched.__wrapped__ = original
        setattr(c10d, name, patched)
        setattr(dist, name, patched)
    if hasattr(c10d, "reduce_scatter_coalesced"):
        c10d.reduce_scatter_coalesced = reduce_scatter_coalesced


def refuse_in_functional(module: ModuleType) -> None:
    """The functional collectives' ``all_to_all_single`` and ``all_to_all_single_autograd``
    (torchtitan's EP dispatch imports both by name) reach ProcessGroupNeuron.alltoall_base with
    their split lists: the same refusal."""
    for name in ("all_to_all_single", "all_to_all_single_autograd"):
        original = getattr(module, name, None)
        if original is None:
            continue

        def patched(self, output_split_sizes, input_split_sizes, group, tag="", _original=original):
            problem = alltoall_base_refusal(_sizes(output_split_sizes), _sizes(input_split_sizes),
                                            _group_size(group))
            if problem:
                raise NotImplementedError(problem)
            return _original(self, output_split_sizes, input_split_sizes, group, tag)

        patched.__wrapped__ = original
        patched.__name__ = name
        setattr(module, name, patched)

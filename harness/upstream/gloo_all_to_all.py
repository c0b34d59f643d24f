"""Expert parallelism over gloo: ``torch.distributed.all_to_all`` with uneven chunks.

Why: torchtitan's EP token dispatch (0.3.0 ``models/common/token_dispatcher.py`` through
spmd_types' ``all_to_all``) sends each expert-parallel rank the tokens routed to its experts,
a different number per rank, with ``dist.all_to_all(output_chunks, input_chunks)``. Gloo's
``alltoall`` requires every chunk to have one shape ("ProcessGroupGloo::alltoall: invalid tensor
size at index 1"), while its ``alltoall_base`` (``all_to_all_single``) takes split sizes. This
shim sends uneven chunks of a gloo group as one ``all_to_all_single`` over their rows: the same
rows reach the same ranks, so the result is the same tensors, bit for bit. Even chunks, and
every other backend, go through unchanged.
"""

from __future__ import annotations

from types import ModuleType

SHIM_NAME = "gloo_all_to_all"


def _uneven(tensors) -> bool:
    return len({tuple(t.shape) for t in tensors}) > 1


def _rows_all_to_all(dist, output_chunks, input_chunks, group):
    """``all_to_all`` of chunks that differ only in their first dimension, as one
    ``all_to_all_single`` over the concatenated rows."""
    import torch  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

    trailing = {tuple(t.shape[1:]) for t in (*output_chunks, *input_chunks)}
    if len(trailing) > 1:
        raise ValueError(f"gloo_all_to_all: chunks differ beyond their first dimension: {trailing}")
    flat_in = torch.cat([t.contiguous() for t in input_chunks])
    flat_out = flat_in.new_empty((sum(t.shape[0] for t in output_chunks), *flat_in.shape[1:]))
    dist.all_to_all_single(flat_out, flat_in, [t.shape[0] for t in output_chunks],
                           [t.shape[0] for t in input_chunks], group=group)
    for chunk, rows in zip(output_chunks, flat_out.split([t.shape[0] for t in output_chunks]), strict=True):
        chunk.copy_(rows)


def send_uneven_chunks_as_rows(c10d: ModuleType) -> None:
    """Patch ``torch.distributed.distributed_c10d.all_to_all`` (and the ``torch.distributed``
    name callers use) for gloo groups."""
    import torch.distributed as dist  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

    original = c10d.all_to_all

    def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
        if (not async_op and (_uneven(output_tensor_list) or _uneven(input_tensor_list))
                and dist.get_backend(group) == "gloo"):
            _rows_all_to_all(dist, output_tensor_list, input_tensor_list, group)
            return None
        return original(output_tensor_list, input_tensor_list, group=group, async_op=async_op)

    all_to_all.__wrapped__ = original
    c10d.all_to_all = all_to_all
    dist.all_to_all = all_to_all

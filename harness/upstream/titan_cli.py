"""What each torchtitan API generation spells its own way on torchtitan's command line.

The launcher builds every run's command line (harness/launch/run.py) from here and not from the
API modules (harness/upstream/titan_api): those import torchtitan's models, about 5 CPU s in a
process that only launches runs (the prefetcher, harness/launch/prefetch.py), and a command line
needs none of it. One function per API module (``LAYOUT_OVERRIDES``), picked by the installed
generation's (harness/registry/generations.py ``API_OF``). No torchtitan import.
"""

from __future__ import annotations

from harness.registry import generations


def _v0_3_layout_overrides(*, tp: int, ep: int, pp: int, ac: str, vocab_size: int) -> tuple[str, ...]:
    """What 0.3.0's command line needs for a layout beyond the parallel degrees, batch and
    compile flags (harness/launch/run.py ``layout_flags``), which both generations spell alike:
    - TP: the loss is computed vocab-parallel (spmd_types), and ``CrossEntropyLoss`` asks for
      the full vocabulary (``--loss.global_vocab_size``; spring's loss has no such field);
    - EP and PP: the trainer refuses EP's CPU-synchronising token dispatcher, and pipeline
      parallelism, unless CUDA graphs are off (``_validate_cuda_graphs``: "CUDA graphs do not
      support pipeline parallelism yet"), even on a host with no CUDA;
    - activation checkpointing is a tyro subcommand (``activation_checkpoint:<mode>``), which
      takes every token after it, so it comes last."""
    flags: tuple[str, ...] = ()
    if tp > 1:
        flags += ("--loss.global_vocab_size", str(vocab_size))
    if ep > 1 or pp > 1:
        flags += ("--training.disable_cuda_graphs",)
    return (*flags, f"activation_checkpoint:{ac}")


def _spring2026_layout_overrides(*, tp: int, ep: int, pp: int, ac: str, vocab_size: int) -> tuple[str, ...]:
    """What spring 2026's command line needs for a layout beyond the parallel degrees, batch
    and compile flags (harness/launch/run.py ``layout_flags``): activation checkpointing is a
    field (``--activation_checkpoint.mode``); TP's loss, EP and PP need nothing more (0.3.0's do)."""
    del tp, ep, pp, vocab_size
    return ("--activation_checkpoint.mode", ac)


# API module (generations.API_OF's values) -> its spelling of a layout's extra flags
LAYOUT_OVERRIDES = {"v0_3": _v0_3_layout_overrides, "spring2026": _spring2026_layout_overrides}


def layout_overrides(*, tp: int, ep: int, pp: int, ac: str, vocab_size: int) -> tuple[str, ...]:
    """The installed generation's flags for a layout (the parallel degrees, batch and compile
    flags aside): see ``LAYOUT_OVERRIDES``."""
    api = generations.api_generation_of(generations.installed_generation())
    return LAYOUT_OVERRIDES[api](tp=tp, ep=ep, pp=pp, ac=ac, vocab_size=vocab_size)

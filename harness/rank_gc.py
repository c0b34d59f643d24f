"""Garbage collection in a launched rank: off while the rank imports, on again as torchtitan's
Trainer is built.

A CPU-tier rank spends about 7 CPU s importing torch and torchtitan (transformers too, for
hf_v5) before its trainer exists. Python's automatic collections over those imports are about
a tenth of it (``scripts/benchmark.py rank-import``) and free nothing the rank needs. torchtitan's
trainer then manages collection itself (``tools.utils.GarbageCollection``: ``gc.disable()``
and one collect as ``Trainer.__init__`` runs, then every ``gc_freq`` steps).

So the boot ``sitecustomize`` of a launched rank (torchrun gave it ``LOCAL_RANK``) turns
automatic collection off, and it is back on when ``Trainer.__init__`` begins: from there the
trainer finds the collector as Python leaves it and does with it what it always does. A rank
that never builds a trainer exits with collection off, having allocated only its imports.
"""

from __future__ import annotations

import gc
import os

RANK_ENV = "LOCAL_RANK"  # torchrun sets it in each worker, not in its own process


def defer_until_trainer() -> None:
    """In a launched rank: collection off now, on again when torchtitan's Trainer is built."""
    if RANK_ENV not in os.environ:
        return
    from harness.upstream.install import after_import

    gc.disable()
    after_import("torchtitan.trainer", enable_as_trainer_builds)


def enable_as_trainer_builds(trainer_module) -> None:
    cls = trainer_module.Trainer
    if getattr(cls, "_harness_rank_gc", False):
        return
    cls._harness_rank_gc = True
    original_init = cls.__init__

    def __init__(self, *args, **kwargs):
        gc.enable()
        original_init(self, *args, **kwargs)

    __init__.__wrapped__ = original_init
    cls.__init__ = __init__

"""Garbage collection over a process's start-up: off while it imports, then on again with
everything the imports allocated frozen. Two processes do it: a launched rank, until
torchtitan's Trainer is built; a pytest process, until its tests are collected.

A CPU-tier rank spends about 7 CPU s importing torch and torchtitan (transformers too, for
hf_v5) before its trainer exists, and a pytest worker about as much collecting the suite.
Python's automatic collections over those imports free nothing either process needs, and
cost about 3 of a rank's 10 CPU s up to torchtitan's first collection
(``scripts/benchmark.py rank-import``: 7 s deferred and frozen, median of 5).

Turning collection back on first freezes what the imports allocated (``gc.freeze``, as a
pre-fork server does before it forks). Without that, the imports' objects (about 0.9 million)
would all still be young, and the first young-generation collection would walk every one of
them: torchtitan's first ``gc.collect(1)`` took 0.4-1.0 s a rank, most of what the deferral
saved. Automatic collection would have aged them into the oldest generation, which
``collect(1)`` (torchtitan's collection) never walks; the permanent generation is walked by no
collection at all, so every later full collection (pytest's at each process's end, a rank's
``gc.collect()`` under torchtitan's ``gc_debug``) skips them too. The one difference either
process could see is a full collection not freeing a reference cycle the imports left: module
state, alive either way.

In a rank, collection is back on as ``Trainer.__init__`` begins, where torchtitan's
``tools.utils.GarbageCollection`` takes it over (``gc.disable()``, one collect, then every
``gc_freq`` steps): the trainer finds the collector on and does with it what it always does. A
rank that never builds a trainer exits with collection off, having allocated only its imports.
"""

from __future__ import annotations

import gc
import os

from harness.upstream.install import after_import

RANK_ENV = "LOCAL_RANK"  # torchrun sets it in each worker, not in its own process


def pause() -> None:
    """Automatic collection off, for the imports that follow."""
    gc.disable()


def resume_frozen() -> None:
    """What is allocated so far frozen, then automatic collection on."""
    gc.freeze()
    gc.enable()


def defer_until_trainer() -> None:
    """In a launched rank (the boot ``sitecustomize``): collection off now, on again (frozen)
    when torchtitan's Trainer is built."""
    if RANK_ENV not in os.environ:
        return

    pause()
    after_import("torchtitan.trainer", enable_as_trainer_builds)


def enable_as_trainer_builds(trainer_module) -> None:
    cls = trainer_module.Trainer
    if getattr(cls, "_harness_startup_gc", False):
        return
    cls._harness_startup_gc = True
    original_init = cls.__init__

    def __init__(self, *args, **kwargs):
        resume_frozen()
        original_init(self, *args, **kwargs)

    __init__.__wrapped__ = original_init
    cls.__init__ = __init__

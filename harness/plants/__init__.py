"""Planted defects: the one mechanism by which the harness shows that its checks can fail.

A plant is a deliberate bug in a copy or a patched module of the system under test, used only
by the harness's self-tests. It is never an upstream defect (those are harness/registry/known_issues/).
Each plant is a ``Plant`` record, and ``registry()`` holds them all by name. The record gives
its name, the component it breaks, what it does, the checks that must catch it, and exactly
one realisation:

- ``patch`` is ``(module, apply)``. ``apply(module)`` breaks an upstream module right after
  it is imported and returns an undo callable. It acts in the launched ranks when a run asks
  for it (``RunSpec(plants=...)``; the ranks read ``HARNESS_PLANTS``). It acts in-process
  inside ``with planted(...)``.
- ``kernel`` is a broken kernel implementation, declared with the cases and dtypes it must be
  caught on. The kernel checker runs it exactly like the real implementations.
- ``make`` builds a broken copy of an input (a checkpoint directory, a state-dict adapter, a
  model config, a loaded model) from the unbroken one. Nothing shared is modified.

The realisations live beside each other: ``in_torchtitan`` (patches), ``kernels``, ``inputs``,
and ``nki_emu`` (patches of the NKI emulator's semantics, in-process only).
Every plant is shown caught by at least one test that names it (tests/selftest/test_plants.py
enforces this).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from harness.registry import environment
from harness.upstream.install import after_import

PLANT_STEP = 2  # the trainer step at which step-triggered plants act

Patch = tuple[str, Callable[[ModuleType], Callable[[], None]]]


@dataclass(frozen=True)
class KernelPlant:
    """A broken implementation of kernel ``op`` and where the checker must catch it."""

    op: str
    implementation: object  # harness.kernels.checks.spec.Implementation
    catch_on: tuple[tuple[str, object], ...]  # (case name, torch dtype)


@dataclass(frozen=True)
class Plant:
    name: str
    breaks: str  # the component: trainer, model, adapter, data, loss, checkpoint, config, kernel
    description: str
    caught_by: tuple[str, ...]  # the checks (or check outputs) that must fail on it
    patch: Patch | None = None
    kernel: KernelPlant | None = None
    make: Callable | None = None
    # Whether its patch acts alike on a module already imported: it replaces a class's method,
    # looked up at each call, not a module-level name that other modules copy as they import
    # it. A warm rank's zygote may then have imported the module (harness/launch/warm.py).
    patches_a_class: bool = False

    def __post_init__(self):
        realisations = [r for r in (self.patch, self.kernel, self.make) if r is not None]
        if len(realisations) != 1:
            raise ValueError(f"plant {self.name!r} needs exactly one of patch, kernel, make")
        if not self.caught_by:
            raise ValueError(f"plant {self.name!r} names no check that must catch it")

    @property
    def realisation(self) -> str:
        return "patch" if self.patch else "kernel" if self.kernel else "make"


@functools.cache
def registry() -> dict[str, Plant]:
    """Every plant by name (built on first use: the realisations import torch)."""
    from harness.plants import in_torchtitan, inputs, kernels, nki_emu  # noqa: PLC0415  heavy: torch; the realisations import it, the names do not

    out: dict[str, Plant] = {}
    for plant in (*in_torchtitan.PATCH_PLANTS, *kernels.KERNEL_PLANTS, *inputs.COPY_PLANTS, *nki_emu.EMULATOR_PLANTS):
        if plant.name in out:
            raise ValueError(f"plant {plant.name!r} is defined twice")
        out[plant.name] = plant
    return out


def plant(name: str) -> Plant:
    try:
        return registry()[name]
    except KeyError:
        raise ValueError(f"unknown plant {name!r}; known: {sorted(registry())}") from None


def of(realisation: str) -> tuple[Plant, ...]:
    """Every plant with that realisation (``patch``, ``kernel`` or ``make``), in registry order."""
    return tuple(p for p in registry().values() if p.realisation == realisation)


def check_patch_names(names) -> tuple[str, ...]:
    """``names`` if each is a plant realised as a patch; otherwise a clear error."""
    names = tuple(names)
    for name in names:
        if plant(name).patch is None:
            raise ValueError(f"plant {name!r} is realised as {plant(name).realisation!r}, "
                             "not as a patch: it cannot be installed in a run")
    return names


def install_in_ranks(names) -> None:
    """In a launched rank: apply each named patch right after its module is first imported.
    (Only the patches are imported here: a rank has no use for the other realisations.)"""
    from harness.plants.in_torchtitan import PATCH_PLANTS  # noqa: PLC0415  heavy: torch; a rank hooks the patches before torch imports

    by_name = {p.name: p for p in PATCH_PLANTS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown plant(s) {unknown} in {environment.PLANTS}; "
                         f"known: {sorted(by_name)}")
    for name in names:
        module, apply = by_name[name].patch
        after_import(module, apply)


def targets(names) -> frozenset[str]:
    """The modules the patch plants ``names`` must act on as they are imported (a warm rank's
    zygote must not have imported one of them first, harness/launch/warm.py); a plant that
    patches a class acts alike later."""
    return frozenset(plant(n).patch[0] for n in check_patch_names(names)
                     if not plant(n).patches_a_class)


def install_from_env() -> None:
    install_in_ranks(environment.names(os.environ.get(environment.PLANTS)))


@contextlib.contextmanager
def planted(*names: str):
    """In-process: the named patches applied inside the block, undone after it."""
    undo = []
    try:
        for name in check_patch_names(names):
            module, apply = plant(name).patch
            undo.append(apply(importlib.import_module(module)))
        yield
    finally:
        for fn in reversed(undo):
            fn()


def make(name: str, *args, **kwargs):
    """The broken copy that plant ``name`` makes from ``args`` (see its ``make``)."""
    p = plant(name)
    if p.make is None:
        raise ValueError(f"plant {name!r} is realised as {p.realisation!r}, not as a broken copy")
    return p.make(*args, **kwargs)

"""The seam: the emulator as ``sys.modules["nki"]`` (and ``nki.language``, ``nki.isa``), the
way nki-library's CPU tests install their simulator, for a ``with`` block.

On exit whatever ``nki*`` modules were there come back, and every module first imported
inside the block that bound the emulator (nki-library's kernels, say, which bound the
emulator's ``nki`` when they imported, and the modules that bound those) leaves
``sys.modules`` again, so nothing outside the block sees the emulator. Those modules are kept
aside and put back on the next entry: they import once per process. Every other module first
imported inside the block stays: the emulator's own (``harness.kernels.emu.*``, which are the
emulator, not bound to it: dropping them made a later ``import harness.kernels.emu.isa`` execute a
second copy, with its own ``Op`` class and instructions) and whatever else (``torch`` or
``numpy`` submodules imported lazily) bound nothing of it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading

from harness.kernels.emu import nki_module

_lock = threading.RLock()
_bound: dict[str, object] = {}  # modules imported under the emulator, kept between entries
_harness_kernels: dict[str, object] = {}
_depth = [0]


def _emulator_modules() -> dict[str, object]:
    return {"nki": nki_module, **{f"nki.{name}": getattr(nki_module, name)
                                  for name in ("language", "isa", "typing", "compiler", "tensor", "builtin")},
            "nki.isa.constants": nki_module.isa.constants, "nki.language.dtypes": nki_module.language.dtypes}


def _is_nki(name: str) -> bool:
    return name == "nki" or name.startswith("nki.")


def _is_emulator(name: str) -> bool:
    return name == __package__ or name.startswith(__package__ + ".")


def _bound_to_emulator(new: dict[str, object]) -> set[str]:
    """The names of the ``new`` modules that hold the emulator: an ``nki*`` module itself, or a
    module whose namespace holds an emulator module, an object defined by the emulator or by a
    module already found bound (transitively: a package whose kernel submodule bound ``nki``)."""
    emulator = {id(module) for module in _emulator_modules().values()}
    bound = {name for name in new if _is_nki(name)}
    candidates = {name: module for name, module in new.items() if not _is_nki(name) and not _is_emulator(name)}
    changed = True
    while changed:
        changed = False
        held = {id(new[name]) for name in bound} | emulator
        for name, module in list(candidates.items()):
            if any(id(value) in held or _defined_in(value, bound) for value in vars(module).values()):
                bound.add(name)
                del candidates[name]
                changed = True
    return bound


def _defined_in(value, modules: set[str]) -> bool:
    owner = getattr(value, "__module__", None)
    return isinstance(owner, str) and (owner in modules or _is_emulator(owner))


@contextlib.contextmanager
def installed():
    """``import nki`` inside the block gets the emulator."""
    with _lock:
        if _depth[0]:
            _depth[0] += 1
            try:
                yield _emulator_modules()["nki"]
            finally:
                _depth[0] -= 1
            return
        saved = {k: v for k, v in sys.modules.items() if _is_nki(k)}
        for k in saved:
            del sys.modules[k]
        before = set(sys.modules)
        sys.modules.update(_emulator_modules())
        sys.modules.update({k: v for k, v in _bound.items() if k not in sys.modules})
        _depth[0] = 1
        try:
            yield sys.modules["nki"]
        finally:
            _depth[0] = 0
            new = {k: v for k, v in sys.modules.items() if k not in before}
            for name in _bound_to_emulator(new):
                module = sys.modules.pop(name)
                if not _is_nki(name):
                    _bound[name] = module
            sys.modules.update(saved)


def import_module(name: str):
    """Module ``name`` imported against the emulator (cached).

    Harness kernel modules (``harness.kernels.ops.nki.*``), already imported against whatever ``nki``
    the process has, are executed again into a separate module object whose ``nki`` is the
    emulator; any other module (nki-library's ``nkilib_src.nkilib...``) is imported inside
    the seam."""
    with installed():
        if name.startswith("harness."):
            if name not in _harness_kernels:
                spec = importlib.util.find_spec(name)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                _harness_kernels[name] = module
            return _harness_kernels[name]
        return importlib.import_module(name)

"""``nki_cpu_simulator``, the package nki-library's simulation mode imports, over the emulator.

nki-library's ``test/utils/simulation_setup.py`` imports ``nki_cpu_simulator.nki`` and its
``.language``, ``.language.dtypes``, ``.isa``, ``.isa.constants``, ``.typing``, ``.compiler``,
``.tensor`` and ``.builtin``, installs them as ``nki``, ``nki.language``, ... and runs each
kernel with ``nki.cpu_simulate(kernel)[lnc](**numpy_inputs)``. AWS's simulator package is not
public; ``install()`` makes that module tree importable under that name, every module being
the emulator's own (``harness.kernels.emu``): ``nki_cpu_simulator.nki`` is the emulator's ``nki``,
so the kernels nki-library's tests run, run on the emulator, unchanged.
"""

from __future__ import annotations

import sys
import types

from harness.kernels.emu import nki_module

PACKAGE = "nki_cpu_simulator"
__emulator__ = True


def modules() -> dict[str, types.ModuleType]:
    """Module name -> module, for the tree simulation_setup.py imports."""
    tree = {"nki": nki_module}
    for name in ("language", "isa", "typing", "compiler", "tensor", "builtin"):
        tree[f"nki.{name}"] = getattr(nki_module, name)
    tree["nki.isa.constants"] = nki_module.isa.constants
    tree["nki.language.dtypes"] = nki_module.language.dtypes
    return {f"{PACKAGE}.{name}": module for name, module in tree.items()}


def install() -> None:
    """``import nki_cpu_simulator.nki...`` finds the emulator from now on, in this process."""
    sys.modules[PACKAGE] = sys.modules[__name__]
    sys.modules.update(modules())


def __getattr__(name: str):
    if name == "nki":
        return nki_module
    raise AttributeError(f"module {PACKAGE} has no attribute {name!r}")

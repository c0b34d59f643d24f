"""The pytest plugin that runs nki-library's own tests on the emulator
(``pytest -p harness.kernels.emu.cpu_simulator.pytest_plugin --test-mode simulation``, from an
unchanged copy of nki-library's source and tests; ``scripts/nkilib_tests.py`` runs it).

Before nki-library's ``test/conftest.py`` is imported (``pytest_load_initial_conftests``), it
puts in place what that tree expects of the machine it runs on, and nothing else:

- ``nki_cpu_simulator`` (``harness.kernels.emu.cpu_simulator.install``), which its
  ``simulation_setup.py`` installs as ``nki``; and the emulator as ``nki`` already, because
  ``test/conftest.py`` imports ``nki.isa`` (through ``test.utils.common_dataclasses``) before
  it sets simulation mode up;
- ``neuronxcc.nki.typing``, which ``core/router_topk/router_topk.py`` imports for its argument
  annotations (neuronx-cc ships it; PyPI's neuronx-cc is a placeholder): the emulator's
  ``nki.typing``, only when no real ``neuronxcc`` is importable;
- ``neuron_dtypes`` (part of the Neuron SDK, not on PyPI), which its test utilities import:
  ``harness.kernels.emu.cpu_simulator.neuron_dtypes``, only when no real one is importable;
- the two modules its public repository imports but does not ship,
  ``test.utils.perf_analysis_private`` and ``test.utils.scripts.remote_lock_scripts``: every
  name in them raises ``NotImplementedError`` when used (only the hardware path uses them);
- ``Orchestrator._compiled_kernel = None``: the simulation path reads it, only the compile path
  sets it.

And one selection of its own: ``--nki-emu-max-elements=N`` deselects the cases whose largest
input has more than N elements, read from the test id: the cross-entropy cases'
(``experimental/loss``) logits B*T*V, the blockwise MoE cases' (``core/moe/moe_cte``)
gate-and-up weights E*H*2I. A small machine holds those neither in memory nor in time (the
test's inputs, its float32 golden and the emulator's copy: about 16 bytes an element);
``--nki-emu-deselected=PATH`` records their ids and sizes.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

from harness.kernels.emu import cpu_simulator, install

ABSENT_MODULES = ("test.utils.perf_analysis_private", "test.utils.scripts.remote_lock_scripts")


class _Absent:
    def __init__(self, qualified: str):
        self.qualified = qualified

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self.qualified}: nki-library's private module is not in its public repository; "
                                  "only its hardware path uses it, not simulation mode")

    def __getattr__(self, name: str):
        return _Absent(f"{self.qualified}.{name}")


def _absent_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "Not in nki-library's public repository (harness.kernels.emu.cpu_simulator.pytest_plugin).")
    def attribute(attribute_name: str):
        if attribute_name.startswith("__"):
            raise AttributeError(attribute_name)
        return _Absent(f"{name}.{attribute_name}")

    module.__getattr__ = attribute
    return module


def _install() -> None:
    cpu_simulator.install()
    sys.modules.update(install._emulator_modules())
    if importlib.util.find_spec("neuronxcc") is None:
        from harness.kernels.emu import nki_module

        for name, module in (("neuronxcc", types.ModuleType("neuronxcc")), ("neuronxcc.nki", types.ModuleType("neuronxcc.nki")),
                             ("neuronxcc.nki.typing", nki_module.typing)):
            sys.modules.setdefault(name, module)
        sys.modules["neuronxcc"].nki = sys.modules["neuronxcc.nki"]
        sys.modules["neuronxcc.nki"].typing = sys.modules["neuronxcc.nki.typing"]
    if importlib.util.find_spec("neuron_dtypes") is None:
        from harness.kernels.emu.cpu_simulator import neuron_dtypes

        sys.modules["neuron_dtypes"] = neuron_dtypes
    for name in ABSENT_MODULES:
        sys.modules.setdefault(name, _absent_module(name))


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """Before nki-library's test/conftest.py is imported (and only in a session that loads
    this plugin: importing the module installs nothing)."""
    _install()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("nki-emu", "nki-library's tests on the harness NKI emulator")
    group.addoption("--nki-emu-max-elements", type=int, default=None,
                    help="deselect the cross-entropy and blockwise-MoE cases whose largest input (logits B*T*V; "
                         "gate-and-up weights E*H*2I) has more elements")
    group.addoption("--nki-emu-deselected", default=None, help="write the deselected test ids and sizes to this file")


# the largest input of a case, from its test id
LOGITS = re.compile(r"_B-(\d+)_T-(\d+)_V-(\d+)_")  # experimental/loss: [B*T, V] logits
MOE_WEIGHTS = re.compile(r"\[BWMMFunc\.\w+-(\d+)-(\d+)-(\d+)-(\d+)-(\d+)-(\d+)-")  # moe_cte: H, T, E, B, K, I


def largest_input(nodeid: str) -> int | None:
    """Elements of a case's largest input (cross-entropy logits, blockwise-MoE gate-and-up
    weights [E, H, 2, I]); None for the other tests."""
    if "/loss/" in nodeid and (match := LOGITS.search(nodeid)):
        return int(match[1]) * int(match[2]) * int(match[3])
    if "/moe_cte/" in nodeid and (match := MOE_WEIGHTS.search(nodeid)):
        hidden, _, experts, _, _, intermediate = (int(g) for g in match.groups())
        return experts * hidden * 2 * intermediate
    return None


def pytest_collection_modifyitems(config, items) -> None:
    limit = config.getoption("--nki-emu-max-elements")
    if limit is None:
        return
    too_big = [item for item in items if (largest_input(item.nodeid) or 0) > limit]
    if not too_big:
        return
    items[:] = [item for item in items if item not in too_big]
    config.hook.pytest_deselected(items=too_big)
    record = config.getoption("--nki-emu-deselected")
    worker = getattr(config, "workerinput", {}).get("workerid", "gw0")
    if record and worker == "gw0":
        Path(record).write_text("".join(f"{item.nodeid}\t{largest_input(item.nodeid)}\n" for item in too_big))


def pytest_configure(config) -> None:
    orchestrator = sys.modules.get("test.utils.test_orchestrator")
    if orchestrator is not None and not hasattr(orchestrator.Orchestrator, "_compiled_kernel"):
        orchestrator.Orchestrator._compiled_kernel = None

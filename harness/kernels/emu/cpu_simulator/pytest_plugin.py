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

The other files' cases carry no such size in their ids, and their runnable cases (those
nki-library's default selection does not skip) are more than a 2-core CI stage runs: the
integration tests of attention, QKV, output projection, norms and MoE hold about 2300. So, for
every file not named by ``--nki-emu-whole``:

- a case whose work, the product of its integer parameters (batch x sequence x heads x head
  size, ...), exceeds ``--nki-emu-max-work`` is deselected by size;
- of the rest, ``--nki-emu-sample=N`` keeps N runnable cases per file, drawn with
  ``random.Random(--nki-emu-seed)`` from the file's case ids in sorted order (the same draw on
  every xdist worker and every run), and deselects the others as not sampled.

``--nki-emu-case-seconds=S`` arms a watchdog (faulthandler) per case: past S seconds the case's
process dumps its stacks (to ``--nki-emu-hang-log``) and ends, and pytest-xdist reports that case
as failed. Under the data cap (``--nki-emu-max-data-gib``) a process can hang instead of raising:
a new thread whose first allocation fails dies inside ``Thread.start``, which then waits forever
(seen at an LNC=2 launch of attention_cte with its worker at 8 GiB).

Every deselected case is recorded with its reason (``size``, ``sample``, or ``platform``: the
cases nki-library's own ``-m trn2`` marker expression drops, its trn3-only tests), so the
runner's table counts each.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import math
import random
import re
import resource
import sys
import types
from pathlib import Path

import pytest

from harness.kernels.emu import cpu_simulator, install, nki_module
from harness.kernels.emu.cpu_simulator import neuron_dtypes

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
    module = types.ModuleType(name, "Not in nki-library's public repository "
                                    "(harness.kernels.emu.cpu_simulator.pytest_plugin).")
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
        for name, module in (("neuronxcc", types.ModuleType("neuronxcc")),
                             ("neuronxcc.nki", types.ModuleType("neuronxcc.nki")),
                             ("neuronxcc.nki.typing", nki_module.typing)):
            sys.modules.setdefault(name, module)
        sys.modules["neuronxcc"].nki = sys.modules["neuronxcc.nki"]
        sys.modules["neuronxcc.nki"].typing = sys.modules["neuronxcc.nki.typing"]
    if importlib.util.find_spec("neuron_dtypes") is None:
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
    group.addoption("--nki-emu-max-work", type=int, default=None,
                    help="deselect a case (of a file not named by --nki-emu-whole) whose integer parameters multiply "
                         "to more")
    group.addoption("--nki-emu-sample", type=int, default=None,
                    help="keep this many runnable cases per file (not named by --nki-emu-whole), drawn with the seed")
    group.addoption("--nki-emu-seed", type=int, default=0, help="the seed of --nki-emu-sample's draw")
    group.addoption("--nki-emu-max-data-gib", type=float, default=None,
                    help="cap each pytest process's data segment (RLIMIT_DATA): a case that outgrows it fails with "
                         "MemoryError in its own process instead of the machine's OOM killer ending another")
    group.addoption("--nki-emu-case-seconds", type=float, default=None,
                    help="a case still running after this many seconds dumps every thread's stack and ends its "
                         "process (faulthandler): a hang fails that case, by name, instead of stalling the run")
    group.addoption("--nki-emu-hang-log", default=None,
                    help="append the stacks of a case past --nki-emu-case-seconds to this file "
                         "(pytest captures stderr)")
    group.addoption("--nki-emu-whole", action="append", default=[],
                    help="a test file (path under test/integration/nkilib) kept whole: no work limit, no sample")


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


def work(item) -> int:
    """The product of a case's positive integer parameters (walking tuples, lists, dicts and a
    parameter object's own attributes, not the objects it refers to): a shape's elements, the
    measure of an emulated case's time and memory. A 0 is a flag, not a size (``fused_add-0``).
    nki-library's ranged tests pass one ``RangeTestCase`` whose shape is its ``tensors`` dict
    (``{"_monotonic_dummy_": {"batch": 4, "seqlen": 7508, ...}}``). 0 without any."""
    numbers: list[int] = []

    def walk(value, depth=0, inside_object=False) -> None:
        if depth > 3 or isinstance(value, (bool, type)):
            return
        if isinstance(value, int):
            if value:
                numbers.append(abs(value))
        elif isinstance(value, (tuple, list)):
            for v in value:
                walk(v, depth + 1, inside_object)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v, depth + 1, inside_object)
        elif hasattr(value, "__dict__") and not callable(value) and not inside_object:
            for v in vars(value).values():
                walk(v, depth + 1, True)

    callspec = getattr(item, "callspec", None)
    for value in (callspec.params.values() if callspec else ()):
        walk(value)
    return math.prod(numbers) if numbers else 0


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0].split("integration/nkilib/")[-1]


def _skipped(item) -> bool:
    return any(mark.name == "skip" for mark in item.iter_markers())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """After nki-library's own selection (its skips, its -m trn2): deselect by size, then sample."""
    limit, max_work = config.getoption("--nki-emu-max-elements"), config.getoption("--nki-emu-max-work")
    sample, whole = config.getoption("--nki-emu-sample"), set(config.getoption("--nki-emu-whole"))
    reasons: dict[str, tuple[str, int | None]] = {}
    for item in items:
        if limit is not None and (largest_input(item.nodeid) or 0) > limit:
            reasons[item.nodeid] = ("size", largest_input(item.nodeid))
        elif max_work is not None and _file(item.nodeid) not in whole and not _skipped(item) \
                and work(item) > max_work:
            reasons[item.nodeid] = ("size", work(item))
    if sample is not None:
        by_file: dict[str, list[str]] = {}
        for item in items:
            if item.nodeid not in reasons and not _skipped(item) and _file(item.nodeid) not in whole:
                by_file.setdefault(_file(item.nodeid), []).append(item.nodeid)
        draw = random.Random(config.getoption("--nki-emu-seed"))
        for path in sorted(by_file):
            ids = sorted(by_file[path])
            kept = set(draw.sample(ids, min(sample, len(ids))))
            reasons.update({nodeid: ("sample", None) for nodeid in ids if nodeid not in kept})
    dropped = [item for item in items if item.nodeid in reasons]
    if dropped:
        items[:] = [item for item in items if item.nodeid not in reasons]
        config.hook.pytest_deselected(items=dropped)
    config._nki_emu_reasons = reasons


def pytest_deselected(items) -> None:
    _DESELECTED.extend(items)


_DESELECTED: list = []


def pytest_collection_finish(session) -> None:
    """Record every deselected case with its reason (on the first xdist worker, or alone)."""
    config = session.config
    record = config.getoption("--nki-emu-deselected")
    worker = getattr(config, "workerinput", {}).get("workerid", "gw0")
    if not record or worker != "gw0":
        return
    reasons = getattr(config, "_nki_emu_reasons", {})
    lines = []
    for item in dict.fromkeys(_DESELECTED):
        reason, size = reasons.get(item.nodeid, ("platform", None))
        lines.append(f"{item.nodeid}\t{size if size is not None else ''}\t{reason}\n")
    Path(record).write_text("".join(lines))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """``--nki-emu-case-seconds``: the case's watchdog. A process at its data cap can hang
    instead of raising (a thread whose first allocation fails dies before ``Thread.start``
    returns); pytest-xdist then reports the case as failed (its worker crashed while running it)
    and goes on with a new worker."""
    seconds = item.config.getoption("--nki-emu-case-seconds", None)
    log = None
    if seconds:
        path = item.config.getoption("--nki-emu-hang-log", None)
        log = open(path, "a") if path else sys.stderr
        faulthandler.dump_traceback_later(seconds, exit=True, file=log)
    try:
        yield
    finally:
        if seconds:
            faulthandler.cancel_dump_traceback_later()
            if log is not sys.stderr:
                log.close()


def pytest_configure(config) -> None:
    cap = config.getoption("--nki-emu-max-data-gib", None)
    if cap:
        limit = int(cap * 2**30)
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    orchestrator = sys.modules.get("test.utils.test_orchestrator")
    if orchestrator is not None and not hasattr(orchestrator.Orchestrator, "_compiled_kernel"):
        orchestrator.Orchestrator._compiled_kernel = None

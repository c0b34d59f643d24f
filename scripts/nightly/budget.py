#!/usr/bin/env python3
"""The nightly's time budget: every child the test step starts, each with the limit that holds it.

    python3 scripts/nightly/budget.py      # the table, and the step and job minutes it needs

The test step's ``timeout-minutes`` (.github/workflows/nightly-trn2.yml) must hold the sum, and
the job's the sum of every step's (tests/e2e/test_workflows.py checks both), so a night that
uses every limit still reports and uploads. Counted on trn2 (the neuron tier's own cases and
limits, whatever stand-in this machine has):

- every launched run at its timeout (harness/device/devices.py NEURON_TIMEOUTS_S: a cold compile);
- the independent HF forward of every full-size pretrained run, in the pytest process (Qwen3-4B
  in float32 on the host CPU on 64 ranks' batches of 2048 tokens: about 1e15 FLOP, minutes at a
  few TFLOP/s; an allowance, not a kill: the step's margin absorbs an overrun);
- the module walks a failing first step starts (harness/diagnosis/diagnose.py: at most
  ``WALKS_PER_SESSION`` per night, each a child of at most ``TIMEOUT_S``);
- the in-process tests of the 'neuron' device, in child pytest processes (harness/launch/own_process.py:
  ``CHILD_TIMEOUT_PER_TEST_S`` per test: NKI compiles);
- the run report (plots, junit, results.json): an allowance.
"""

from __future__ import annotations

import ast
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.device.devices import NEURON_TIMEOUTS_S
from harness.diagnosis.diagnose import TIMEOUT_S, WALKS_PER_SESSION
from harness.launch.own_process import CHILD_TIMEOUT_PER_TEST_S
from harness.launch.run_matrix import cases, layout_cases

REPO = Path(__file__).resolve().parents[2]
REFERENCE_ALLOWANCE_S = 30 * 60
REPORT_ALLOWANCE_S = 10 * 60
# The steps around the test step (checkout, environment, cache, install, data, baseline,
# summary, uploads): their own limits, which the workflow states step by step.


@dataclass(frozen=True)
class Item:
    what: str
    count: int
    each_s: float
    held_by: str

    @property
    def minutes(self) -> float:
        return self.count * self.each_s / 60


def neuron_kernel_tests() -> int:
    """The in-process tests of the 'neuron' device a trn2 session runs: every kernel
    conformance cell on neuron (op x implementation x case x dtype, tests/kernels/
    test_conformance.py) and every test of tests/kernels/test_neuron.py."""
    from harness.kernels.checks.registry import OPS  # noqa: PLC0415  heavy: torch, torchtitan, for the kernel count alone

    cells = sum(len(case.dtypes) for op in OPS.values() for impl in op.implementations
                if "neuron" in impl.devices for case in op.cases if impl.runs_case("neuron", case.name))
    module = ast.parse((REPO / "tests" / "kernels" / "test_neuron.py").read_text())
    tests = sum(isinstance(n, ast.FunctionDef) and n.name.startswith("test_") for n in module.body)
    return cells + tests


def items() -> list[Item]:
    neuron = [c for c in cases(("neuron",))]
    # the size of every launched run: the tier's cases, and its tiny layouts (NEURON_LAYOUTS)
    sizes = [c.size for c in neuron] + ["tiny" for _ in layout_cases(("neuron",))]
    out = [Item(f"{size} runs", sizes.count(size), NEURON_TIMEOUTS_S[size],
                "harness/device/devices.py NEURON_TIMEOUTS_S (the launcher kills the run)")
           for size in ("tiny", "full")]
    references = sum(c.size == "full" and c.init == "pretrained" for c in neuron)
    out += [
        Item("HF-forward references (full-size pretrained)", references, REFERENCE_ALLOWANCE_S,
             "allowance (in-process)"),
        Item("module walks (diagnosis children)", WALKS_PER_SESSION["neuron"], TIMEOUT_S,
             "harness/diagnosis/diagnose.py WALKS_PER_SESSION x TIMEOUT_S"),
        Item("in-process neuron tests (child pytest processes)", neuron_kernel_tests(),
             CHILD_TIMEOUT_PER_TEST_S, "harness/launch/own_process.py CHILD_TIMEOUT_PER_TEST_S"),
        Item("run report", 1, REPORT_ALLOWANCE_S, "allowance"),
    ]
    return out


def test_step_minutes() -> int:
    return math.ceil(sum(item.minutes for item in items()))


def main() -> int:
    rows = items()
    for item in rows:
        print(f"{item.what:52s} {item.count:4d} x {item.each_s / 60:6.1f} min = "
              f"{item.minutes:7.1f} min  ({item.held_by})")
    print(f"{'test step needs':52s} {test_step_minutes():>27d} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())

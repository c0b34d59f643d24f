"""A run spread over several nodes is the run on one node (``RunSpec.nodes``).

Specification, on the cpu tier, every node a torchrun agent of its own on this machine
(harness/launch/run.py ``node_commands``: torchrun's static rendezvous, node i holding global
ranks i*per_node + local rank), all writing one dump folder:
- the tiny pretrained titan_native run under FSDP over 2 nodes of 1 rank completes and equals
  the template's 1-node 2-rank run bit for bit, every step's loss and pre-clip grad norm (the
  same computation over gloo); every rank's metrics sink is in the shared dump folder, and the
  run's rank logs hold both global ranks, each log naming its own (torchtitan's structured-log
  line ``...global_rank_<R>...``);
- (slow) HSDP over 2 nodes of 2 ranks equals the 1-node 4-rank HSDP run within the policy's
  ``layout_loss`` / ``layout_grad_norm`` (harness/registry/tolerances.py);
- nodes that do not divide the run's ranks are refused, naming the fix, before anything is
  launched.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from harness.checks import run_checks as checks
from harness.device.devices import profile_for
from harness.launch.run import RunSpec, launch
from harness.launch.run_matrix import LayoutCase, RunCase
from harness.parity import curves
from harness.registry import dump_layout

TEMPLATE = RunCase("cpu", "titan_native", "tiny", "pretrained", "sdpa")
# What every rank of torchtitan logs as it starts: its structured-log file, named by global rank.
_GLOBAL_RANK = re.compile(r"\.global_rank_(\d+)\.")


def bitwise_differences(run, other) -> list[str]:
    """Every step whose loss or pre-clip grad norm is not the other run's, bit for bit."""
    found = [] if len(run.steps) == len(other.steps) else [
        f"{len(run.steps)} steps against {len(other.steps)}"]
    for mine, theirs in zip(run.steps, other.steps, strict=False):  # unequal lengths are named above
        for what in ("loss", "grad_norm"):
            a, b = getattr(mine, what), getattr(theirs, what)
            if a.hex() != b.hex():
                found.append(f"step {mine.step} {what}: {a!r} vs {b!r} (diff {a - b:.3e})")
    return found


def rank_problems(result) -> list[str]:
    """The run's ranks as its nodes left them: every global rank's metrics sink in the shared
    dump folder, and its logs, naming that global rank, under the global rank number."""
    ranks = list(range(result.nproc))
    found = []
    sinks = sorted(dump_layout.metrics_files(result.run_dir))
    if sinks != ranks:
        found.append(f"metrics sinks of ranks {sinks}, not {ranks}")
    if sorted(result.rank_logs) != ranks:
        found.append(f"rank logs of global ranks {sorted(result.rank_logs)}, not {ranks}")
    for rank, files in sorted(result.rank_logs.items()):
        text = "".join(f.read_text(errors="replace") for f in files if f.is_file())
        named = sorted({int(r) for r in _GLOBAL_RANK.findall(text)})
        if named != [rank]:
            found.append(f"rank {rank}'s logs ({files[0].parent}) name global rank(s) {named}")
    return found


def test_two_nodes_of_one_rank_are_the_two_rank_run_bit_for_bit(device_runs, steps, workarounds):
    runs = device_runs("cpu")
    spec = TEMPLATE.run_spec(steps, workarounds=workarounds)
    one = checks.completed_or_known(runs.get(spec), steps)
    two = checks.completed_or_known(runs.get(replace(spec, nodes=2)), steps)
    assert (two.nproc, two.spec.nodes, one.nproc) == (2, 2, 2), two.describe()
    assert "@2nodes" in two.spec.name and two.spec.name != one.spec.name, (two.spec.name, one.spec.name)
    problems = rank_problems(two)
    assert not problems, "\n".join([*problems, two.describe()])
    differ = bitwise_differences(two, one)
    assert not differ, "\n".join(["2 nodes x 1 rank is not the 1-node 2-rank run:", *differ,
                                  two.describe(), one.describe()])


@pytest.mark.slow
def test_hsdp_over_two_nodes_equals_the_one_node_hsdp_run(device_runs, steps, workarounds):
    case = LayoutCase("cpu", "titan_native", "hsdp")
    runs = device_runs("cpu")
    spec = case.run_spec(steps, workarounds=workarounds)
    one = checks.completed_or_known(runs.get(spec), steps)
    two = checks.completed_or_known(runs.get(replace(spec, nodes=2)), steps)
    assert (two.nproc, two.spec.nodes) == (4, 2) and "@hsdp@2nodes" in two.spec.name, two.describe()
    problems = rank_problems(two)
    assert not problems, "\n".join([*problems, two.describe()])
    reports = curves.curve_reports(two.spec.name, two, "the 1-node run", one, "float32",
                                   loss="layout_loss", grad_norm="layout_grad_norm")
    problem = curves.curves_problem(reports, two.describe(), one.describe())
    assert problem is None, problem


def test_nodes_that_do_not_divide_the_ranks_are_refused_before_launch(tmp_path):
    spec = RunSpec("titan_native", init="pretrained", steps=1, nodes=3)
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"2 ranks do not split over 3 nodes; make nodes a divisor of 2"):
        launch(spec, profile_for("cpu"), run_dir)
    assert not run_dir.exists(), "the refused run left a run folder"

"""Every layout's cheap form reaches the condition its class of bug needs.

Each layout of the registry (harness/registry/layouts.py) names the condition its class of bug
needs before it shows (``Layout.condition``: uneven split, uneven valid tokens, recompute of a
stateful forward, uneven all-to-all, partial sums) and the default-tier test that reaches it
(``Layout.reached_by``, a pytest node id). The rule, held here for every layout:
- the condition is one of ``CONDITIONS``;
- a layout the default tier runs in a cheap form names its test; a slow-only or full-size
  layout may leave it empty (its condition is then reached in the slow or neuron tier);
- the named test exists, and neither it nor the parameter it names is in the slow tier;
- the runs it reads reach the condition, judged from the harness's own case data: a world size
  that does not divide a sharded dimension of the fixture it resumes; microbatches of data with
  ignored labels (SFT) under gradient accumulation; a MoE under full activation checkpointing;
  a MoE under expert parallelism (top-k routing over 32 experts sends chunks of other sizes);
  a sum split over ranks (tensor or context parallel, replicas) or a compiled reduction.
A layout whose cheap form does not reach its condition fails (shown below on the forms the
default tier ran before: a 1-rank resume, ``ga=2`` on packed rows, AC only as ``ac=none``).
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from harness.launch.run import RunSpec
from harness.launch.run_matrix import RESHARD_CASES, LayoutCase, layout_cases
from harness.registry.layouts import (
    CONDITIONS,
    LAYOUTS,
    PARTIAL_SUMS,
    STATEFUL_RECOMPUTE,
    UNEVEN_ALL_TO_ALL,
    UNEVEN_SPLIT,
    UNEVEN_VALID_TOKENS,
    Layout,
)

SFT = "sft"  # data with ignored labels (prompts, EOS padding): harness/backends/sft_config.py
PACKED = "packed"  # the layout runs' pretraining rows: every label valid

# What the default tier's non-parametrized tests of a layout read: the runs as the harness's
# case data names them (tests/parity/test_layouts.py ``_ac_pair`` and ``sft_ga_pair``).
READS = {
    "tests/parity/test_layouts.py::test_full_ac_on_the_moe_equals_no_ac":
        [(LayoutCase("cpu", "nki_moe", "ac=full"), PACKED), (LayoutCase("cpu", "nki_moe", "ac=none"), PACKED)],
    "tests/parity/test_layouts.py::test_gradient_accumulation_over_uneven_valid_tokens_is_the_single_batch":
        [(LayoutCase("cpu", "titan_native", "ga=2"), SFT), (LayoutCase("cpu", "titan_native", "fsdp"), SFT)],
}


def _slow(obj) -> bool:
    return any(mark.name == "slow" for mark in getattr(obj, "pytestmark", ()))


def _sharded_dims(backend: str) -> set[int]:
    """The first dimensions FSDP shards in the backend's tiny fixture: the vocabulary, the
    hidden size and, for a MoE, the routed experts."""
    config = RunSpec(backend).model_config
    return {config[k] for k in ("vocab_size", "hidden_size", "num_local_experts") if k in config}


def reached(case: LayoutCase, data: str, condition: str) -> bool:
    """Whether a run of ``case`` on ``data`` reaches ``condition``."""
    lay, kind = case.layout_spec, RunSpec(case.backend).model_kind
    return {
        UNEVEN_VALID_TOKENS: data == SFT and lay.ga > 1,
        STATEFUL_RECOMPUTE: kind == "moe" and lay.ac == "full",
        UNEVEN_ALL_TO_ALL: kind == "moe" and lay.ep > 1,
        PARTIAL_SUMS: lay.tp > 1 or lay.cp > 1 or lay.replicate > 1 or bool(lay.compile),
        UNEVEN_SPLIT: False,  # a layout run keeps the saving world size: only a resume reshards
    }[condition]


def condition_problems(lay: Layout, cpu_cases=None) -> list[str]:
    """Everything in which ``lay`` breaks the rule (module docstring)."""
    cpu_cases = {c.id: c for c in (cpu_cases if cpu_cases is not None else layout_cases(("cpu",)))}
    if lay.condition not in CONDITIONS:
        return [f"{lay.name}: condition {lay.condition!r} is not one of {CONDITIONS}"]
    if not lay.reached_by:
        return [] if (lay.slow or lay.full_size) else [
            f"{lay.name}: the default tier runs it, and it names no test that reaches {lay.condition!r}"]
    path, _, name = lay.reached_by.partition("::")
    function, _, param = name.partition("[")
    param = param.rstrip("]")
    module = importlib.import_module(path[:-3].replace("/", "."))
    test = getattr(module, function, None)
    if test is None:
        return [f"{lay.name}: {lay.reached_by} names no test"]
    if _slow(test):
        return [f"{lay.name}: {lay.reached_by} is in the slow tier"]
    found = []
    if param in cpu_cases:  # a layout case's test
        case = cpu_cases[param]
        if case.slow:
            found.append(f"{lay.name}: {param} runs in the slow tier")
        if not reached(case, PACKED, lay.condition):
            found.append(f"{lay.name}: {param} does not reach {lay.condition!r}")
    elif param and any(c.id == param for c in RESHARD_CASES):  # a resharded resume
        case = next(c for c in RESHARD_CASES if c.id == param)
        ranks = case.ranks or LAYOUTS[case.layout].ranks
        if case.slow:
            found.append(f"{lay.name}: the resume {param} runs in the slow tier")
        if lay.condition != UNEVEN_SPLIT or not any(d % ranks for d in _sharded_dims(case.backend)):
            found.append(f"{lay.name}: the resume {param} at {ranks} ranks does not reach "
                         f"{lay.condition!r} (sharded dimensions {sorted(_sharded_dims(case.backend))})")
    elif not param and lay.reached_by in READS:
        runs = READS[lay.reached_by]
        slow = [c.id for c, data in runs if data == PACKED and c.id in cpu_cases and cpu_cases[c.id].slow]
        if slow:
            found.append(f"{lay.name}: {lay.reached_by} reads the slow tier's {slow}")
        if not any(reached(c, data, lay.condition) for c, data in runs):
            found.append(f"{lay.name}: none of the runs {lay.reached_by} reads reaches {lay.condition!r}")
    else:
        found.append(f"{lay.name}: {lay.reached_by}: the rule cannot tell which runs it reads")
    return found


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_names_its_condition_and_the_default_tier_case_reaching_it(name):
    found = condition_problems(LAYOUTS[name])
    assert not found, "\n".join(found)


def test_every_condition_is_reached_in_the_default_tier():
    reached_somewhere = {lay.condition for lay in LAYOUTS.values() if lay.reached_by}
    assert reached_somewhere == set(CONDITIONS), sorted(set(CONDITIONS) - reached_somewhere)


@pytest.mark.parametrize("broken, why", [
    # the default tier's resume before: 1 rank divides every dimension
    (replace(LAYOUTS["fsdp"], reached_by="tests/parity/test_layout_resharded_resume.py::"
                                         "test_resharded_resume_is_the_uninterrupted_run[2-to-1]"), "slow tier"),
    # ga=2 on packed rows: every microbatch holds the same number of valid labels
    (replace(LAYOUTS["ga=2"], reached_by="tests/parity/test_layouts.py::test_layout_equals_the_fsdp_run"
                                         "[cpu-nki_moe-tiny-pretrained@ga=2]"), "does not reach"),
    # activation checkpointing reached only by its no-AC reference
    (replace(LAYOUTS["ac=full"], reached_by="tests/parity/test_layouts.py::test_layout_equals_the_fsdp_run"
                                            "[cpu-nki_moe-tiny-pretrained@ac=none]"), "does not reach"),
    (replace(LAYOUTS["ep"], condition="uneven shards"), "not one of"),
    (replace(LAYOUTS["tp"], reached_by=""), "names no test"),
], ids=["resume-at-1-rank", "ga-on-packed-rows", "ac-none-only", "unknown-condition", "no-case"])
def test_a_layout_whose_cheap_form_does_not_reach_its_condition_fails(broken, why):
    # the cases as the default tier ran them before: nki_moe ga=2 packed in the default tier
    cpu = [c if (c.backend, c.layout) != ("nki_moe", "ga=2") else replace(c, slow=False)
           for c in layout_cases(("cpu",))]
    found = condition_problems(broken, cpu)
    assert any(why in f for f in found), found

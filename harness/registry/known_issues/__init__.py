"""Every confirmed upstream defect the harness knows, as data: the one registry, and the one
place the rest of the harness asks about it (``known_issues.judge``, ``applicable``, ``issue``,
``workaround``, ``ISSUES``, ``WORKAROUNDS``, ``WORKAROUND_OPTION``; a test ends on a verdict
with ``known_issues.settle``).

The mechanism (what an entry is, how a check is judged against the entries, how a test ends
on the verdict) is harness/registry/known_issues/mechanism.py. The entries are grouped by what they
concern, one module each:

| module            | the known issues of                                                  |
|-------------------|----------------------------------------------------------------------|
| ``hf_backend``    | torchtitan 0.3.0's transformers modeling backend (``hf_v5``)           |
| ``native_qwen3``  | torchtitan's native Qwen3 (``titan_native``)                           |
| ``kernels``       | the kernels under conformance (check ``kernel``)                       |
| ``pytorch``       | torch itself: grouped GEMM, DTensor random init on a CPU mesh          |
| ``spring2026``    | torchtitan ``main`` of spring 2026, inherited by its fork              |
| ``neuron``        | the Neuron stack (torch-neuronx's process group): what trn2 cannot run |

A new entry goes into the module of what it concerns, and into that module's ``ISSUES``.
"""

from __future__ import annotations

from harness.registry.known_issues import hf_backend, kernels, native_qwen3, neuron, pytorch, spring2026
from harness.registry.known_issues.mechanism import (
                                           KnownIssue,
                                           Registry,
                                           Signature,
                                           Verdict,
                                           Where,
                                           Workaround,
                                           inherited,
                                           settle,
)

__all__ = ["ISSUES", "KnownIssue", "REGISTRY", "Signature", "Verdict", "WORKAROUNDS",
           "WORKAROUND_OPTION", "Where", "Workaround", "applicable", "inherited", "issue",
           "judge", "settle", "workaround"]

ISSUES: tuple[KnownIssue, ...] = (*hf_backend.ISSUES, *native_qwen3.ISSUES, *kernels.ISSUES,
                                  *pytorch.ISSUES, *spring2026.ISSUES, *neuron.ISSUES)
REGISTRY = Registry(ISSUES)

applicable = REGISTRY.applicable
judge = REGISTRY.judge
issue = REGISTRY.issue
workaround = REGISTRY.workaround
WORKAROUNDS: dict[str, Workaround] = REGISTRY.workarounds

# The one --workaround option (pytest and ``python -m harness`` alike): validated names only.
WORKAROUND_OPTION = dict(
    action="append", default=[], choices=sorted(WORKAROUNDS), metavar="NAME",
    help="apply the workaround of a known upstream defect (harness/registry/known_issues/) to every run "
         f"and in-process suite it changes, repeatable; one of {', '.join(sorted(WORKAROUNDS))}")

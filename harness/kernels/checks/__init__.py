"""Kernel conformance checks (the machinery; the harness's own kernels are in ``harness/kernels/ops``):
an op registry with float64 references, implementations under test, the tolerance policy
(``harness/registry/tolerances.py``, kernel section) with float64 arbitration, and diagnostics that save
replayable inputs.

    from harness.kernels.checks.registry import OPS          # ops -> cases, implementations
    from harness.kernels.checks.runner import run, judge     # run + check one combination, per property
    python -m harness.kernels.checks list [--run]            # what can run on this machine
    python -m harness.kernels.checks bench OP IMPL           # first-call vs steady-state time

Modules: ``references`` (the registry's references; the harness kernels' twins live beside
the kernels as ``X_torch.py``), ``cases`` (seeded inputs), ``adapters/`` (one per implementing
library), ``registry`` (also checks each kernel's torch twin), ``compare`` (the rules),
``runner``, ``diagnostics`` (report + replay file), ``calibrate``, ``cli``, ``neuron_env`` (the LNC for in-process NKI
calls). Upstream deviations are ``KnownIssue`` entries in ``harness/registry/known_issues/``
(check ``"kernel"``), judged per property. The broken implementations the checker must
catch are plants (``harness/plants/kernels.py``).
"""

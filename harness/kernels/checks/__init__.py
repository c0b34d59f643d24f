"""Kernel conformance checks (the machinery; the harness's own kernels are in ``harness/ops``):
an op registry with float64 references, implementations under test, the tolerance policy
(``harness/tolerances.py``, kernel section) with float64 arbitration, and diagnostics that save
replayable inputs.

    from harness.kernel_checks.registry import OPS          # ops -> cases, implementations
    from harness.kernel_checks.runner import run, judge     # run + check one combination, per property
    python -m harness.kernel_checks list [--run]            # what can run on this machine
    python -m harness.kernel_checks bench OP IMPL           # first-call vs steady-state time

Modules: ``references`` (the registry's references; the harness kernels' twins live beside
the kernels as ``X_torch.py``), ``cases`` (seeded inputs), ``adapters/`` (one per implementing
library), ``registry`` (also checks each kernel's torch twin), ``compare`` (the rules),
``runner``, ``diagnostics`` (report + replay file), ``calibrate``, ``cli``, ``neuron_env`` (the LNC for in-process NKI
calls). Upstream deviations are ``KnownIssue`` entries in ``harness/known_issues/``
(check ``"kernel"``), judged per property. The broken implementations the checker must
catch are plants (``harness/plants/kernels.py``).
"""

"""Kernel conformance: an op registry with float64 references, implementations under test,
a tolerance policy with float64 arbitration, and diagnostics that save replayable inputs.

    from harness.kernels.registry import OPS          # ops -> cases, implementations
    from harness.kernels.runner import run            # run + check one combination
    python -m harness.kernels list [--run]            # what can run on this machine

Modules: ``references`` (math, float64-capable), ``cases`` (seeded inputs), ``adapters/``
(one per implementing library), ``registry``, ``tolerances`` (policy + measured numbers),
``compare`` (the rules), ``runner``, ``diagnostics`` (report + replay file), ``defects``
(planted broken implementations the checker must catch), ``findings`` (upstream deviations),
``calibrate``, ``cli``.
"""

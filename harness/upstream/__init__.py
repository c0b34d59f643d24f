"""Version-specific shims for upstream packages, all in one place.

Every shim here exists because a supported torchtitan generation (0.3.0, or spring-2026
``main`` that TorchTitan Neuron forks; see harness/upstream/titan_api) on torch 2.14 cannot run some
harness code path unmodified. Each has a reason, is installed only where needed (by the device profile, in
the launched ranks), and has a test in ``tests/selftest/test_upstream_shims.py`` that fails the day
upstream no longer needs it, so it can be deleted.

The rank-side realisations of opt-in workarounds live here too: ``hf_rope_init`` (a shim) and
``titan_overrides`` (torchtitan ``--override.imports``). Each belongs to a known issue in
harness/registry/known_issues/, whose check fails as stale the day upstream fixes the issue.

Beside the shims, the rest of the harness's contact with upstream: ``titan_api`` (one API per
torchtitan generation), ``workarounds`` (the in-process bodies of the registry's workarounds),
``metrics_sink`` (torchtitan's MetricsProcessor plus the harness's JSONL sink, installed like a
shim), ``versions`` (the versions every result records). The ranks' boot folder is
harness/rank/boot.
"""

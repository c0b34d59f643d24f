"""Known issues of torchtitan's native Qwen3 (backend ``titan_native``): the one home of its
entries and their workarounds (``titan_4b_theta``). What an entry is:
harness/registry/known_issues/mechanism.py.
"""

from __future__ import annotations

from harness.registry.known_issues.mechanism import KnownIssue, Signature, Where, Workaround

TITAN_4B_THETA = Workaround(
    name="titan_4b_theta",
    what="set every layer's RoPE theta from the checkpoint's config.json (5e6 for 2507)",
    rank_shim="titan_4b_theta",  # the "4B" flavor's theta from the run's assets (harness/upstream)
    backends=("titan_native",),
    in_process="harness.upstream.workarounds:theta_from_hf",
)

TITAN_4B_ROPE_THETA = KnownIssue(
    name="titan-4B-rope-theta-1e6",
    upstream="torchtitan 0.3.0 models/qwen3/__init__.py _4b(): CosSinRoPE.Config(theta=1e6)",
    summary="the native \"4B\" flavor hard-codes rope theta 1e6; Qwen3-4B-Instruct-2507's "
            "config.json says 5e6 and Qwen3StateDictAdapter never compares them, so 2507 "
            "weights load silently into a model that rotates q/k at the wrong frequencies.",
    evidence="config conformance vs fixtures/reference_configs/Qwen3-4B-Instruct-2507: "
             "rope_theta 1e6 vs 5e6 in 36/36 layers; the built RoPE's output is off by max "
             "rel 1.97 from RoPE at theta 5e6.",
    where=(Where(check="config_conformance", subject=("flavor:4B", "backend:titan_native.full")),),
    signature=Signature(quantity="violated_fields",
                        equals=("RoPE computation", "rope_theta (rope config)")),
    workaround=TITAN_4B_THETA,
)

ISSUES: tuple[KnownIssue, ...] = (
    TITAN_4B_ROPE_THETA,
)

"""Known upstream deviations from the float64 reference beyond tolerance.

Each finding names the combinations it explains; tests for them are ``xfail(strict=True)``:
they keep running, the report says why, and if upstream changes so the case passes, the strict
xfail fails and the entry must be revisited. Tolerances are never widened to absorb a finding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Finding:
    key: str
    ops: tuple[str, ...]
    impls: tuple[str, ...]
    cases: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    devices: tuple[str, ...]
    text: str


_ROPE_CACHE_USERS = ("torchtitan", "transformers", "harness_op", "nki_contract", "nki_kernel", "nkilib")
_ALL_DEVICES = ("cpu", "cuda", "nki-sim", "neuron")

FINDINGS: tuple[Finding, ...] = (
    Finding(
        key="F1-rope-float32-angles",
        ops=("rotary_embedding",),
        impls=_ROPE_CACHE_USERS,
        cases=("long_positions",),
        dtypes=(torch.float32,),
        devices=_ALL_DEVICES,
        text=(
            "float32 RoPE angle error grows with the position. torchtitan CosSinRoPE._precompute_cache "
            "computes inv_freq and t*inv_freq in float32 (transformers Qwen3RotaryEmbedding likewise: "
            "inv_freq @ position_ids in float32), so the rotation angle carries ~|angle|*2^-24 rad of error. "
            "Measured against float64 (float32 inputs), max error in units of u=2^-24 of the row scale: "
            "positions 0..3 -> 7u (2.1x the float32 floor), <= 10 -> 16u (5.3x; within K=8), "
            "32768..40959 -> 9.4e4 u = 5.6e-3 relative, 2.9e4x the floor (y), 2.6e4x (grad_x). The same op fed a cache built in float64 and cast to float32 stays <= 1.7u "
            "and <= 1.7x the floor at every position. bfloat16 is unaffected (the angle error stays "
            "below bf16 rounding up to 40960). The harness op inherits torchtitan's cache by design (parity)."
        ),
    ),
    Finding(
        key="F2-torchtitan-router-cpu-autocast",
        ops=("moe_router",),
        impls=("torchtitan",),
        cases=("qwen3_30b_a3b", "qwen3_30b_64e_top4", "single_token", "all_to_one_expert", "exact_ties", "near_ties", "bf16_extremes"),
        dtypes=(torch.bfloat16,),
        devices=("cpu",),
        text=(
            "TokenChoiceTopKRouter.forward computes the gate under torch.autocast(device_type, dtype=float32) "
            "and then states 'scores_BLE is already float32 from the autocast above'. CPU autocast does not "
            "support float32 (torch warns 'CPU Autocast only supports dtypes of torch.bfloat16, torch.float16' "
            "and disables it), so on CPU with bfloat16 activations/gate weights the gate logits, softmax and "
            "returned top-k scores are bfloat16, not float32. Values stay within the bfloat16 tolerance; the "
            "documented float32 dtype of the scores does not hold (on CUDA it does)."
        ),
    ),
)


def finding_for(op: str, impl: str, case: str, dtype: torch.dtype, device: str) -> Finding | None:
    for finding in FINDINGS:
        if (
            op in finding.ops
            and impl in finding.impls
            and case in finding.cases
            and dtype in finding.dtypes
            and device in finding.devices
        ):
            return finding
    return None


# Findings outside the conformance matrix (asserted elsewhere), kept here so every upstream
# deviation is listed in one place.
OTHER_FINDINGS = {
    "F3-grouped-mm-cpu-expanded-grad": (
        "torch 2.14 CPU: torch._grouped_mm's backward rejects a stride-0 (expanded) grad_output with "
        "'Invalid strides/sizes, got [0, 0] for strides', so GroupedExperts(x, counts).sum().backward() "
        "raises on CPU. Real training grads come through scatter_add and are dense, so the trainer is "
        "unaffected; harness::grouped_swiglu makes the grad contiguous. "
        "tests/kernels/test_custom_ops.py::test_torchtitan_grouped_experts_backward_with_expanded_gradient (strict xfail)."
    ),
    "F4-grouped-mm-unowned-rows": (
        "torch._grouped_mm (CPU) leaves output rows at or past offsets[-1] uninitialised (observed values "
        "like 1.9e29); GroupedExperts returns them as is. The LocalTokenDispatcher never produces such rows. "
        "harness::grouped_swiglu zeroes them (documented difference)."
    ),
    "F5-grouped-mm-alignment": (
        "GroupedExperts requires dim and hidden_dim to be multiples of 8 in bfloat16 (torch._grouped_mm: "
        "'strides should be multiple of 16 bytes'); the harness op falls back to a per-expert loop."
    ),
}

"""Known issues of torch itself (2.14): the one home of the entries for its grouped GEMM (the
checks of tests/kernels/test_custom_ops.py; formerly harness/kernels/findings.py F3 and F5) and
for DTensor's random init on a CPU mesh, with its workaround (``dtensor_full_init``). What an
entry is: harness/registry/known_issues/mechanism.py.
"""

from __future__ import annotations

from harness.registry.known_issues.mechanism import KnownIssue, Signature, Where, Workaround

GROUPED_MM_CPU_EXPANDED_GRAD = KnownIssue(
    name="torch-grouped-mm-cpu-expanded-grad",
    upstream="torch 2.14 CPU torch._grouped_mm backward (via torchtitan 0.3.0 GroupedExperts)",
    summary="(F3) the backward rejects a stride-0 (expanded) grad_output, so "
            "GroupedExperts(x, counts).sum().backward() raises on CPU. Training grads come "
            "through scatter_add and are dense, so the trainer is unaffected; "
            "harness::grouped_swiglu makes the grad contiguous.",
    evidence="RuntimeError 'Invalid strides/sizes, got [0, 0] for strides' "
             "(tests/kernels/test_custom_ops.py::test_torchtitan_grouped_experts_backward_with_expanded_gradient).",
    where=(Where(check="grouped_mm_expanded_grad", impl=("torchtitan",), device=("cpu",)),),
    signature=Signature(quantity="error", equals="RuntimeError: Invalid strides/sizes"),
)

GROUPED_MM_ALIGNMENT = KnownIssue(
    name="torch-grouped-mm-bf16-alignment",
    upstream="torch 2.14 torch._grouped_mm (via torchtitan 0.3.0 GroupedExperts)",
    summary="(F5) GroupedExperts needs dim and hidden_dim to be multiples of 8 in bfloat16 "
            "('strides should be multiple of 16 bytes'); the harness op falls back to a "
            "per-expert loop instead.",
    evidence="GroupedExperts(dim=20, hidden_dim=12) in bfloat16 raises RuntimeError "
             "(tests/kernels/test_custom_ops.py).",
    where=(Where(check="grouped_mm_alignment", impl=("torchtitan",), dtype=("bfloat16",)),),
    signature=Signature(quantity="error", equals="RuntimeError: strides should be multiple of 16 bytes"),
)

DTENSOR_FULL_INIT = Workaround(
    name="dtensor_full_init",
    what="each FSDP-sharded parameter's init drawn as the whole tensor, every rank keeping its "
         "Shard(0) slice (harness/upstream/dtensor_full_init.py; pure FSDP only, anything "
         "else refused by name)",
    rank_shim="dtensor_full_init",
    backends=("titan_native", "nki_moe"),  # torchtitan's Module._init_param; hf_v5 inits through transformers
)

TORCH_DTENSOR_CPU_RANDOM_INIT = KnownIssue(
    name="torch-dtensor-random-init-identical-shards-on-cpu",
    upstream="torch 2.14.0 torch/distributed/tensor/_random.py is_rng_supported_mesh (the RNG "
             "tracker only for device modules with set_rng_state; torch.cpu has none), with "
             "torchtitan's init on FSDP DTensors seeded alike on every rank (protocols/module.py "
             "Module._init_param via trainer.py init_weights; the transformers backend's "
             "_init_weights_patched, nn.init.trunc_normal_ on each DTensor)",
    summary="on a CPU device mesh a random op on a sharded DTensor runs on each local shard, and "
            "every rank's generator is in the same state, so every randomly initialised "
            "FSDP parameter is N copies of one shard: a 2-rank random-init model has duplicated "
            "experts (expert i == expert i + E/2), tied router rows, the embedding of token t "
            "equal to that of t + V/2. Only the fused QKV init (a whole replicated draw) escapes. "
            "The first-step loss (about ln V) does not show it.",
    evidence="2-rank CPU random-init runs (python -m harness run --inits random --steps 2), "
             "shard fingerprints (sha1 of each rank's local shard at step 1), sharded "
             "non-constant parameters identical on both ranks: torchtitan 0.3.0 titan_native 9 "
             "of 11 (0.818: all but the fused wqkv, drawn whole), nki_moe 12 of 14 (0.857: "
             "experts, router gates, wo, w1-w3, embedding, head); spring2026 (separate wq/wk/wv) "
             "titan_native 15 of 15, nki_moe 18 of 18; hf_v5 15 of 15 on both. The dumped step-0 "
             "weights show it whole: tok_embeddings rows 0..1023 == rows 1024..2047, expert i == "
             "expert i+16, router rows i == i+16. The rank logs warn 'DTensor random operators "
             "may not have complete support on cpu device mesh'. Whether torch-neuronx's device "
             "module has set_rng_state (so the tracker runs on trn2) is not in the Neuron 2.33 "
             "docs: neuron stays checked strictly.",
    where=(Where(check="shards_distinct", init=("random",), device=("cpu",)),),
    signature=Signature(quantity="identical_fraction", low=0.6, high=1.0),
    workaround=DTENSOR_FULL_INIT,
)

TORCH_FLEX_BACKWARD_CPU_COMPILED = KnownIssue(
    name="torch-flex-attention-backward-cpu-compiled",
    upstream="torch 2.14 torch.nn.attention.flex_attention: backward on CPU (eager: "
             "_validate_device refuses it; compiled: inductor's flex backward lowering), reached "
             "by torchtitan 0.3.0's transformers backend under --compile.components model",
    summary="FlexAttention has no backward on CPU. Eager, the harness's flex_attention_cpu shim "
            "lifts the device check and differentiates through the dense reference; compiled, "
            "inductor lowers the flex backward and fails, so the transformers backend (flex "
            "attention on 0.3.0) cannot train with its model compiled on CPU. A CPU limit, not "
            "a defect of the layout: the cuda tier runs the same case. Native Qwen3 compiles "
            "with sdpa, its default.",
    evidence="hf_v5 tiny pretrained, 2 ranks, --compile.enable --compile.components model,loss: "
             "every rank fails at step 1 in inductor with 'InductorError: IndexError: tuple "
             "index out of range'. In-process, torch.compile(flex_attention) on a 1x2x128x16 "
             "causal BlockMask, .sum().backward(): 'NotImplementedError: FlexAttention does "
             "not support backward on CPU' as is, the same InductorError with the device check "
             "lifted.",
    where=(Where(check="completed", backend=("hf_v5",), device=("cpu",), layout=("compile",),
                 generation=("v0_3",)),),
    signature=Signature(quantity="error", contains=("InductorError: IndexError: tuple index out of range",)),
)

ISSUES: tuple[KnownIssue, ...] = (
    TORCH_FLEX_BACKWARD_CPU_COMPILED,
    GROUPED_MM_CPU_EXPANDED_GRAD,
    GROUPED_MM_ALIGNMENT,
    TORCH_DTENSOR_CPU_RANDOM_INIT,
)

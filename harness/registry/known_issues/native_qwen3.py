"""Known issues of torchtitan's native Qwen3 (backend ``titan_native``): the one home of its
entries and their workarounds (``titan_4b_theta``). What an entry is:
harness/registry/known_issues/mechanism.py.
"""

from __future__ import annotations

from harness.registry.known_issues.mechanism import KnownIssue, Signature, Where, Workaround
from harness.registry.layouts import LAYOUTS

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

TITAN_MOE_HF_LOAD_UNDER_HSDP = KnownIssue(
    name="titan-qwen3-moe-hf-load-under-hsdp",
    upstream="torchtitan 0.3.0 models/utils.py MoEStateDictAdapter._caculate_indices_from_placements "
             "(placement.dim on every mesh dimension), from Qwen3StateDictAdapter.to_hf at the HF load",
    summary="loading HF weights into the native Qwen3 MoE under HSDP fails before step 1: the "
            "adapter asks every placement of an expert weight for its sharded dim, and HSDP's "
            "replicate dimension holds a Replicate, which has none. FSDP, EP and FSDP x EP "
            "load; so does the dense model under HSDP. Workaround: start the MoE from a DCP "
            "checkpoint (converted once under FSDP), or train it under FSDP x EP.",
    evidence="tiny_moe, 2 ranks (2 replicas x 1) and 4 ranks (2 x 2), --checkpoint.initial_load_in_hf: "
             "AttributeError: 'Replicate' object has no attribute 'dim' in "
             "_caculate_indices_from_placements, every rank, no step logged.",
    where=(Where(check="completed", backend=("nki_moe",), init=("pretrained",), layout=("hsdp",),
                 generation=("v0_3",)),),
    signature=Signature(quantity="error",
                        contains=("'Replicate' object has no attribute 'dim'",)),
)

# Every layout whose MoE forward runs again in the backward pass (activation checkpointing,
# selective by default, with an uncompiled model): all but ac=none and compile, from the registry.
RECOMPUTING_LAYOUTS = tuple(lay.name for lay in LAYOUTS.values()
                            if lay.ac != "none" and "model" not in lay.compile)

TITAN_MOE_COUNTS_DOUBLED_UNDER_AC = KnownIssue(
    name="titan-moe-routing-counts-doubled-under-activation-checkpointing",
    upstream="torchtitan 0.3.0 models/common/moe.py MoE.forward (line 446) and spring 2026 main "
             "(line 424): tokens_per_expert_E.add_ in the forward, which activation "
             "checkpointing runs again in the backward; upstream's own TODO says so",
    summary="under activation checkpointing (selective, torchtitan's default, or full) every "
            "MoE layer counts each token's chosen experts twice: the expert-usage counts are "
            "doubled. The expert-bias update is unaffected (it takes the sign of count minus "
            "mean, and both double). Uncompiled ac=none counts once, and so does compile. "
            "Workaround for usage statistics: halve them under AC, or read them from an "
            "ac=none or compiled run.",
    evidence="tiny_moe, 2 ranks, step 1: sum of tokens_per_expert_E before the update / (top-k "
             "4 x 512 tokens fed) = 2.0 in every layer and rank under fsdp, ac=full, ep, ga=2 "
             "and tp (4096 and 8192 for 2048 and 4096 choices); 1.0 under ac=none and compile.",
    where=(Where(check="moe_routing_counts", backend=("nki_moe",), layout=RECOMPUTING_LAYOUTS),),
    signature=Signature(quantity="counts_ratio", equals=2.0),
)

TITAN_PP_TIED_EMBEDDINGS = KnownIssue(
    name="titan-pp-tied-embeddings",
    upstream="torchtitan 0.3.0 and spring 2026 main models/common/decoder.py (Decoder config "
             "check: enable_weight_tying with pipeline_parallel_degree > 1); the transformers "
             "backend has no such check",
    summary="torchtitan's pipeline parallelism cannot train a model whose output projection is "
            "its embedding: Qwen3-4B ties them (tie_word_embeddings), and so does the tiny dense "
            "fixture. Native Qwen3 refuses the run as it builds. The transformers backend builds "
            "the last stage with an lm_head of its own, and the HF load then finds no "
            "lm_head.weight in the tied checkpoint. The untied MoE (nki_moe) trains under PP. "
            "Workaround: train the tied dense models without PP (TP and FSDP).",
    evidence="tiny_dense, 2 and 4 ranks, --parallelism.pipeline_parallel_degree 2, pretrained: "
             "titan_native: NotImplementedError: Weight tying is not supported with Pipeline "
             "Parallel. (every rank, no step); hf_v5 (0.3.0): RuntimeError: Missing key in "
             "checkpoint state_dict: lm_head.weight. (both ranks, no step). nki_moe: 10 steps.",
    # The transformers backend's pretrained runs reach PP on 0.3.0 only (on spring 2026 it cannot
    # load HF weights at all: spring2026-hf_v5-no-hf-state-dict-adapter).
    where=(Where(check="completed", backend=("titan_native",), layout=("fsdp+pp",)),
           Where(check="completed", backend=("hf_v5",), layout=("fsdp+pp",), generation=("v0_3",))),
    signature=Signature(quantity="error",
                        contains=("Weight tying is not supported with Pipeline Parallel",
                                  "Missing key in checkpoint state_dict: lm_head.weight")),
)

TITAN_MOE_HF_SAVE_UNEVEN_EXPERTS = KnownIssue(
    name="titan-moe-hf-save-uneven-experts",
    upstream="torchtitan 0.3.0 models/qwen3 state-dict adapter (to_hf of the routed experts) "
             "through _caculate_indices_from_placements",
    summary="the MoE's HF save fails when its routed experts do not split evenly over the "
            "ranks: 32 experts at 3 ranks. Training and the DCP checkpoints are unaffected, and "
            "so is a resume at 3 ranks. Workaround: save HF at a world size that divides the "
            "experts, or convert the DCP checkpoint at one.",
    evidence="tiny_moe random, 3 ranks, 2 steps, --checkpoint.last_save_in_hf: both steps "
             "logged, then ValueError: Dim 0 size (32) cannot be evenly divided by shard degree "
             "(3) in the save. Spring 2026 main saves (its adapter's expert keys are another "
             "issue); 0.3.0 at 2 and 4 ranks saves.",
    where=(Where(check="hf_save", backend=("nki_moe",), generation=("v0_3",), ranks=("3",)),),
    signature=Signature(quantity="error", contains=("cannot be evenly divided by shard degree",)),
)

ISSUES: tuple[KnownIssue, ...] = (
    TITAN_MOE_HF_SAVE_UNEVEN_EXPERTS,
    TITAN_PP_TIED_EMBEDDINGS,
    TITAN_MOE_COUNTS_DOUBLED_UNDER_AC,
    TITAN_4B_ROPE_THETA,
    TITAN_MOE_HF_LOAD_UNDER_HSDP,
)

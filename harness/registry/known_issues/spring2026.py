"""Known issues of torchtitan ``main`` of spring 2026 (generation ``spring2026``, the Neuron
fork's base; harness/upstream/titan_api/spring2026.py): the one home of its entries. A fork inherits
them (harness/registry/generations.py ``FORK_OF``; harness/registry/known_issues/mechanism.py ``inherited``).

The first three make its transformers backend unusable; their workarounds are applied whenever
that backend is built on this generation (titan_api.transformers_backend), and
tests/selftest/test_upstream_shims.py tells when each stops being needed.
"""

from __future__ import annotations

from harness.registry.known_issues.mechanism import KnownIssue, Signature, Where, Workaround

SPRING_HF_CONFIG_KW_ONLY = KnownIssue(
    name="spring2026-hf_v5-config-not-keyword-only",
    upstream="torchtitan main a9c5edc74 experiments/transformers_modeling_backend/model.py "
             "HFTransformerModel.Config(BaseModel.Config, PretrainedConfig), transformers 5.x",
    summary="the config class is declared keyword-only but transformers 5's PreTrainedConfig "
            "dataclass fields are not, so torchtitan/config/configurable.py raises at import: "
            "the transformers backend cannot be used with transformers 5 at all (0.3.0 fixed it "
            "by redeclaring those fields init=False).",
    evidence="TypeError: HFTransformerModel.Config field 'transformers_version' must be "
             "keyword-only, at `import torchtitan.experiments.transformers_modeling_backend`.",
    where=(Where(check="transformers_backend_import", generation=("spring2026",)),),
    signature=Signature(quantity="error", equals="TypeError: HFTransformerModel.Config field "
                        "'transformers_version' must be keyword-only"),
    workaround=Workaround("hf_config_kw_only", "keyword-only check skips PretrainedConfig's own "
                          "fields (harness/upstream/hf_config_kw_only.py)", rank_shim="hf_config_kw_only"),
)

SPRING_HF_SHAPE = KnownIssue(
    name="spring2026-hf_v5-flavor-overrides-config-json",
    upstream="torchtitan main a9c5edc74 transformers_modeling_backend/model.py update_from_config",
    summary="the flavor's TitanDenseModelConfig (dim 4096, 32 layers) overrides config.json, "
            "intermediate_size is recomputed llama-style and head_dim forced to dim // n_heads: "
            "the model built is not the checkpoint's (Qwen3-4B: head_dim 128 becomes 80).",
    evidence="tiny_dense built with head_dim 32 instead of config.json's 48 (parameter count "
             "differs from the HF model's).",
    where=(Where(check="transformers_backend_shape", generation=("spring2026",)),),
    signature=Signature(quantity="head_dim", equals="hidden_size // num_attention_heads"),
    workaround=Workaround("hf_shape_from_config", "keep every shape field from config.json "
                          "(harness/upstream/hf_shape_from_config.py)", rank_shim="hf_shape_from_config"),
)

SPRING_HF_TIED_FSDP = KnownIssue(
    name="spring2026-hf_v5-tied-embedding-fsdp",
    upstream="torchtitan main a9c5edc74 transformers_modeling_backend/parallelize.py apply_fsdp",
    summary="the embedding and [norm, lm_head] are separate FSDP groups, so a tied embedding "
            "fails even on one rank.",
    evidence="ValueError: Parameter 'None' is shared with a parameter already managed by "
             "another FSDP group (tiny_dense, tied).",
    where=(Where(check="transformers_backend_fsdp", generation=("spring2026",)),),
    signature=Signature(quantity="error", equals="ValueError: Parameter 'None' is shared with a "
                        "parameter already managed by another FSDP group"),
    workaround=Workaround("hf_tied_fsdp", "one FSDP group for the tied embedding and "
                          "[norm, lm_head], as 0.3.0 (harness/upstream/hf_tied_fsdp.py)",
                          rank_shim="hf_tied_fsdp"),
)

SPRING_HF_NO_STATE_DICT_ADAPTER = KnownIssue(
    name="spring2026-hf_v5-no-hf-state-dict-adapter",
    upstream="torchtitan main a9c5edc74 experiments/transformers_modeling_backend/__init__.py "
             "model_registry: state_dict_adapter=None",
    summary="the transformers backend has no HF state-dict adapter, so it can neither load "
            "HF weights (--checkpoint.initial_load_in_hf: the source's pretrained runs) nor save "
            "them (--checkpoint.last_save_in_hf). Its random-init runs are launched without the "
            "HF save (check hf_save), so everything else about them stays checked.",
    evidence="tiny_dense, 2 ranks: pretrained: AssertionError: trying to load checkpoint in HF "
             "safetensors format, but sd_adapter is not provided.; random with the HF save: "
             "ValueError: checkpoint.last_save_in_hf is True, but sd_adapter is not provided.",
    where=(Where(check="completed", backend=("hf_v5",), init=("pretrained",),
                 generation=("spring2026",)),
           Where(check="hf_save", backend=("hf_v5",), generation=("spring2026",)),
           Where(check="hf_checkpoint_complete", backend=("hf_v5",), generation=("spring2026",))),
    signature=Signature(quantity="error", contains=("sd_adapter is not provided",)),
    signatures=(("hf_checkpoint_complete",
                 Signature(quantity="error", contains=("no HF checkpoint under",))),),
)

SPRING_MOE_ADAPTER_EXPERTS = KnownIssue(
    name="spring2026-qwen3-moe-adapter-expert-keys",
    upstream="torchtitan main a9c5edc74 models/qwen3/state_dict_adapter.py lines 65-67",
    summary="the MoE experts map to layers.{}.moe.experts.w1/w2/w3, but the parameters are "
            "named w1_EFD/w2_EDF/w3_EFD; the load is non-strict, so the routed experts silently "
            "keep their random init when HF weights are loaded.",
    evidence="tiny_moe (32 experts, top-4) pretrained step 1, sdpa: 2.4701 vs recorded 1.2691: "
             "+1.20 (the 8-expert top-2 fixture gave +0.96 sdpa, +1.01 flex). The HF save (to_hf) "
             "drops the experts the same way: "
             "the saved checkpoint lacks every mlp.experts.gate_up_proj / down_proj. The "
             "2-rank CPU pretrained run's shard fingerprints: the routed experts of both layers "
             "(6 of 27 sharded parameters) identical on both ranks, the unloaded random init; "
             "every other parameter loaded and distinct. In process, the adapter's to_hf of "
             "tiny_moe's state (tests/parity/test_native_to_hf.py; with and without the "
             "harness's custom ops) gives 21 of the 213 tensors of the harness's own conversion "
             "(harness/parity/conformance/native_to_hf.py), every one bit for bit equal, and lacks "
             "exactly the other 192: 2 layers x 32 experts x gate/up/down_proj.",
    where=(Where(check="first_step_loss", backend=("nki_moe",), init=("pretrained",),
                 generation=("spring2026",)),
           Where(check="hf_checkpoint_complete", backend=("nki_moe",), generation=("spring2026",)),
           # the unloaded experts keep the random init, whose shards are identical on a CPU
           # mesh (torch-dtensor-random-init-identical-shards-on-cpu)
           Where(check="shards_distinct", backend=("nki_moe",), init=("pretrained",),
                 device=("cpu",), generation=("spring2026",)),
           # in process (tests/parity): the adapter's load and save of tiny_moe, and every
           # comparison of the native MoE model loaded through it
           Where(check="checkpoint_conformance", subject=("tiny_moe",), generation=("spring2026",)),
           Where(check="native_moe_parity", subject=("tiny_moe",), generation=("spring2026",)),
           # the harness's own native -> HF conversion against the adapter's to_hf
           Where(check="native_to_hf_vs_adapter", subject=("tiny_moe",), generation=("spring2026",))),
    signature=Signature(quantity="deviation", low=0.7, high=1.3),
    signatures=(("hf_checkpoint_complete",
                 Signature(quantity="missing_key_kinds",
                           equals=("mlp.experts.down_proj", "mlp.experts.gate_up_proj"))),
                # 2-rank CPU pretrained run: exactly the routed experts (6 of 27) duplicated
                ("shards_distinct", Signature(quantity="identical_kinds",
                                              equals=("moe.experts.w1_EFD", "moe.experts.w2_EDF",
                                                      "moe.experts.w3_EFD"))),
                # every violated key is a routed expert's (in-process: 0 others of 48 + 6)
                ("checkpoint_conformance", Signature(quantity="keys_outside_routed_experts", equals=0)),
                # in-process native loss on tiny_moe's first batch 2.2593 vs transformers
                # 1.2698: the comparisons fail while exactly the experts were left unloaded
                ("native_moe_parity", Signature(quantity="native_keys_not_loaded",
                                                equals=("moe.experts.w1_EFD", "moe.experts.w2_EDF",
                                                        "moe.experts.w3_EFD"))),
                # the to_hf output lacks exactly every routed expert's tensors; the rest equal
                ("native_to_hf_vs_adapter", Signature(quantity="missing_key_kinds",
                                                      equals=("mlp.experts.down_proj.weight",
                                                              "mlp.experts.gate_proj.weight",
                                                              "mlp.experts.up_proj.weight")))),
)

SPRING_TIED_OUTPUT_INIT = KnownIssue(
    name="spring2026-titan-tied-output-init-dim-scale",
    upstream="torchtitan main a9c5edc74 models/qwen3/__init__.py _output_linear_init "
             "(trunc-normal std dim^-0.5) on a tied output layer",
    summary="native Qwen3's tied output layer, and so the embedding, starts at std dim^-0.5: at "
            "small widths the embedding dominates the residual stream and each position "
            "predicts its own input token, far above ln V + s^2/2 (as "
            "hf_v5-tied-embedding-init-scale); at Qwen3-4B width the effect is gone.",
    evidence="tiny_dense (hidden 128, tied) random-init step 1: 11.7021 vs ln V + 1/2 = 8.1246 "
             "(+3.58). The mechanism, at another width (hidden 64, 2 layers, V 2048): every "
             "position's argmax is its own input token (rate 1.000 on 2 x 256 random tokens, "
             "one process), the own logit s*d = 7.89 against N(0, s^2 d) for the rest, so the "
             "loss is ln(V e^(s^2 d/2) + k e^(s d)): 8.70 for k = 1 (measured 8.711), 9.069 for "
             "k = 2 (a 2-rank CPU run, each embedding row twice: "
             "torch-dtensor-random-init-identical-shards-on-cpu; measured 9.0727); untied, the "
             "same shape gives 8.079 against ln V + s^2 d/2 = 8.111. A tied config of a shape "
             "the harness does not know is held to its step-0 weights' forward alone "
             "(fixtures/expectations.toml unless_tied).",
    where=(Where(check="first_step_loss", backend=("titan_native",), init=("random",),
                 size=("tiny",), generation=("spring2026",)),),
    signature=Signature(quantity="deviation", low=3.0, high=4.5),
)

SPRING_HF_ROW_POSITIONS = KnownIssue(
    name="spring2026-hf_v5-row-positions",
    upstream="torchtitan main a9c5edc74 experiments/transformers_modeling_backend/model.py "
             "HFTransformerModel.forward (position_ids = arange(max_seq_len)); attn_mask_type "
             "declared but unused (no get_attention_masks)",
    summary="the transformers backend discards the dataloader's per-document positions and "
            "attends causally over the whole packed row at row positions: it is native sdpa's "
            "model, and no setting gives native flex's per-document one (0.3.0's backend masks "
            "causally at per-document positions instead: hf_v5-causal-mask-across-documents, "
            "whose hf_block_causal has no counterpart here).",
    evidence="in-process, tiny_dense, one 2x256 batch, RoPE recomputed: the backend's loss minus "
             "the per-document reference's: +0.00325; against the row-causal reference at row "
             "positions it agrees within the float32 logits tolerance "
             "(tests/parity/test_hf_backend_parity.py). Signature [0.001, 0.01]: 0.3.0's mask "
             "issue is +0.054 and RoPE off +1.1 on the same batch.",
    where=tuple(Where(check=c, backend=("hf_v5",), attention=("flex",), generation=("spring2026",))
                for c in ("attention_mask", "logits_vs_reference")),
    signature=Signature(quantity="deviation", low=0.001, high=0.01),
)

SPRING_QWEN3_NO_LOAD_BALANCING = KnownIssue(
    name="spring2026-qwen3-moe-no-load-balancing-hook",
    upstream="torchtitan main a9c5edc74 models/qwen3/__init__.py model_registry: ModelSpec("
             "post_optimizer_build_fn=None) (0.3.0: register_moe_load_balancing_hook; "
             "deepseek_v3 and gpt_oss register it on main too)",
    summary="Qwen3 MoE never registers the aux-loss-free load-balancing update: expert_bias_E "
            "stays at zero whatever load_balance_coeff says, and tokens_per_expert_E is never "
            "reset, so every Qwen3 MoE run trains without the load balancing its configuration "
            "asks for.",
    evidence="nki_moe tiny, 2 ranks, 2 steps (tests/e2e/test_training_state.py, rank-side "
             "records): expert_bias_E exactly 0 after both optimizer steps while the choices were "
             "unbalanced (layer 0 step 1 over both ranks: 580, 504, 442, 522 per expert of the "
             "first four; the update should move it by +-1e-3); rank 0 layer 0 expert 0 count "
             "350 after step 1 and 618 = 350 + 268 before step 2's update. 0.3.0, same run: the "
             "bias moves by exactly the update and the counts reset.",
    where=(Where(check="moe_load_balancing", backend=("nki_moe",), generation=("spring2026",)),),
    signature=Signature(quantity="finding_kinds", equals=("bias not updated", "counts not reset")),
)

SPRING_HF_OPTIMIZER_RESUME = KnownIssue(
    name="spring2026-hf_v5-optimizer-state-does-not-load",
    upstream="torchtitan main a9c5edc74 components/optimizer.py OptimizersContainer.load_state_dict "
             "(flattened optimizer state, torch 2.14 set_optimizer_state_dict) with the "
             "transformers backend's model (HFTransformerModel), as built with the hf_tied_fsdp "
             "workaround, without which it does not build",
    summary="the transformers backend cannot resume from its own full checkpoint: the "
            "optimizer state is saved under the parameters' full names "
            "(optimizer.param_groups.model.model.layers.0....) and looked up under names "
            "without the model's prefix (param_groups.layers.0....), so the load raises before "
            "step 1, at any world size. Native Qwen3 resumes; a run that must resume trains on "
            "0.3.0 or the native model.",
    evidence="hf_v5 tiny random, 2 ranks, a full checkpoint after step 1, resumed from it with "
             "--checkpoint.no-initial-load-model-only: KeyError: "
             "'param_groups.layers.0.self_attn.q_proj.weight.pattern' in "
             "_unflatten_optim_state_dict, every rank, no step logged; the checkpoint's "
             "metadata holds 'optimizer.param_groups.model.model.layers.0.self_attn.q_proj."
             "weight.pattern'. The same at 1, 3 and 4 ranks and under TP. 0.3.0: resumes. "
             "Not the workaround's: hf_tied_fsdp only moves the tied embedding into the "
             "[norm, lm_head] fully_shard group and renames nothing, and the names that differ "
             "are the decoder layers', which it does not touch.",
    where=(Where(check="resume", backend=("hf_v5",), generation=("spring2026",)),),
    signature=Signature(quantity="error", contains=("KeyError: 'param_groups.",)),
)

ISSUES: tuple[KnownIssue, ...] = (
    SPRING_HF_OPTIMIZER_RESUME,
    SPRING_HF_CONFIG_KW_ONLY,
    SPRING_HF_SHAPE,
    SPRING_HF_TIED_FSDP,
    SPRING_HF_NO_STATE_DICT_ADAPTER,
    SPRING_MOE_ADAPTER_EXPERTS,
    SPRING_TIED_OUTPUT_INIT,
    SPRING_HF_ROW_POSITIONS,
    SPRING_QWEN3_NO_LOAD_BALANCING,
)

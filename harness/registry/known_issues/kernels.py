"""Known issues of the kernels under conformance: the one home of the entries of check
``kernel`` (harness/kernels/checks/runner.py judges each property of a cell; the selectors name
the one property excused). Formerly harness/kernels/findings.py F1 and F2 (F3 and F5, torch's
grouped GEMM, are in harness/registry/known_issues/pytorch.py); and nki-library's kernels' races that the
NKI emulator records (check ``nki_emu_race``, harness/kernels/ops/nki/). What an entry is:
harness/registry/known_issues/mechanism.py.
"""

from __future__ import annotations

from harness.registry.known_issues.mechanism import KnownIssue, Signature, Where

_ROPE_CACHE_USERS = ("torchtitan", "transformers", "harness_op", "nki_contract", "nki_kernel", "nkilib")

KERNEL_ROPE_FLOAT32_ANGLES = KnownIssue(
    name="kernel-rope-float32-angles",
    upstream="torchtitan 0.3.0 models/common/rope.py CosSinRoPE._precompute_cache; transformers "
             "5.9.0 Qwen3RotaryEmbedding.forward (inv_freq @ position_ids in float32)",
    summary="(F1) the RoPE cache is built in float32, so the rotation angle p*inv_freq carries "
            "~|angle|*2^-24 rad of error, growing with the position: at long positions the "
            "float32 outputs and gradients miss the float64 rotation by far more than float32 "
            "rounding. bfloat16 is unaffected (below bf16 rounding up to 40960); the harness op "
            "and the NKI kernels inherit torchtitan's cache by design (parity).",
    evidence="vs float64 (float32 inputs), max error in u=2^-24 of the row scale: positions 0..3 "
             "-> 7u, <= 10 -> 16u (within tolerance), 32768..40959 (case long_positions) -> y "
             "9.37e4 u (5.6e-3 relative, 2.9e4x the float32 floor), grad_x 7.09e4 u. A cache "
             "built in float64 and cast to float32 stays <= 1.7u at every position.",
    where=tuple(Where(check="kernel", op=("rotary_embedding",), impl=_ROPE_CACHE_USERS,
                      case=("long_positions",), dtype=("float32",), property=(prop,))
                for prop in ("y", "grad_x")),
    signature=Signature(quantity="error_u", low=1e4, high=3e5),
)

KERNEL_TITAN_ROUTER_CPU_AUTOCAST = KnownIssue(
    name="kernel-titan-router-cpu-autocast-bf16-scores",
    upstream="torchtitan 0.3.0 models/common/moe.py TokenChoiceTopKRouter.forward, torch 2.14 CPU",
    summary="(F2) the gate runs under torch.autocast(device_type, dtype=float32) and the code "
            "then assumes 'scores_BLE is already float32'; CPU autocast does not support float32 "
            "(torch warns and disables it), so with bfloat16 activations on CPU the returned "
            "top-k scores are bfloat16, not float32. Only the dtype is wrong: values, routing "
            "sets and gradients stay within the bfloat16 tolerance (and are checked).",
    evidence="every router case in bfloat16 on CPU: weights dtype torch.bfloat16 (documented "
             "float32); on CUDA float32.",
    where=(Where(check="kernel", op=("moe_router",), impl=("torchtitan",), device=("cpu",),
                 dtype=("bfloat16",), property=("dtype:weights",)),),
    signature=Signature(quantity="dtype", equals="torch.bfloat16"),
)

NKILIB_BWD_EA_GRAD_RACE = KnownIssue(
    name="nkilib-bwd-ea-grad-lnc-race",
    upstream="nki-library d2ad3a5 src/nkilib_src/nkilib/experimental/moe/bwd/bwmm_bwd_dropless.py: "
             "lines 115-128 (the zeroing of expert_affinities_masked_grad) and 686-697 (the per-block "
             "EA grad store), blockwise_mm_bwd at LNC=2",
    summary="a cross-core write-write race: each program zeroes the flat slices [e*T, (e+1)*T) of "
            "expert_affinities_masked_grad ([T*E, 1]) for its half of the EXPERTS (shard_E = E // 2; "
            "with odd E the last expert's slice is zeroed by nobody; with E == 1 every program zeroes it "
            "all), while the EA grad stores split "
            "the BLOCKS between the programs, with no core_barrier between the zeroing and the "
            "stores: one program's zeroing can clobber the other's EA grad (on hardware the zeroing "
            "usually runs first and wins the race by timing). harness::grouped_swiglu_backward "
            "drops the EA grad (affinity 1.0, computed from y), so its gradients are unaffected.",
    evidence="NKI emulator (lnc-race, harness/kernels/emu/races.py), tests/kernels/test_moe_backward.py case "
             "two_blocks_for_one_expert (counts 300/0/20, D=F=64, T=321, E=3): programs (0,) and (1,) "
             "leave 175.0 vs 0.0 at flat index 321 of [963, 1]; conformance grouped_swiglu nki_kernel "
             "cases qwen3_30b_dims ([6, 1], 5 elements, 6.25 vs 0.0) and all_rows_one_expert "
            "([136, 1], 2 elements, -0.00116 vs 0.0). Every raced element lies in the slice the other "
            "program's zeroing covers, with that program's value 0.0.",
    where=(Where(check="nki_emu_race", op=("grouped_swiglu_backward",), impl=("nkilib_blockwise_mm_bwd",)),),
    signature=Signature(quantity="race", equals="write-write lnc-race on expert_affinities_masked_grad [T*E, 1] "
                                                "at elements only the zeroing program's 0.0 contests"),
)

# nki-library's own integration tests (check ``nkilib_suite``: scripts/nkilib_tests.py, case = the
# test file under test/integration/nkilib): defects of nki-library's tree itself, which fail its tests
# on any simulator or device, counted apart from the emulator's failures.
NKILIB_MLP_DOCSTRING_INDENT = KnownIssue(
    name="nkilib-mlp-py-does-not-parse",
    upstream="nki-library d2ad3a5 (NKI Lib 2026-04-13) src/nkilib_src/nkilib/core/mlp/mlp.py, line 203; the "
             "nki_library wheel of the same commit ships the same file",
    summary="the mlp() kernel's docstring is closed one paragraph early (after 'CTE mode supports: ...'), so "
            "its 'TKG mode supports:' paragraph is indented code after the docstring: the module does not "
            "parse (IndentationError: unexpected indent), and every test file that imports it, "
            "core/mlp/test_mlp_cte.py and core/mlp/test_mlp_tkg.py, fails at collection, on any simulator "
            "or on trn2. No workaround: the tree's files are not edited.",
    evidence="scripts/nkilib_tests.py: both files error at collection with 'IndentationError: unexpected "
             "indent' at mlp.py line 203 ('TKG mode supports:'); python3 -m py_compile of the wheel's and "
             "the tarball's mlp.py fails alike.",
    where=(Where(check="nkilib_suite", case=("core/mlp/test_mlp_cte.py", "core/mlp/test_mlp_tkg.py")),),
    signature=Signature(quantity="error", contains=("IndentationError: unexpected indent",)),
)

NKILIB_QKV_TKG_PLATFORMS_UNDEFINED = KnownIssue(
    name="nkilib-qkv-tkg-test-platforms-undefined",
    upstream="nki-library d2ad3a5 test/integration/nkilib/core/qkv/test_qkv_tkg.py, line 929 (class "
             "TestQkvTkgKernel)",
    summary="a test method is decorated @pytest.mark.platforms(exclude=[Platforms.TRN1, Platforms.TRN2]) and "
            "annotated 'platform_target: Platforms', but the module never imports Platforms (it imports "
            "other names from test.utils.common_dataclasses): the class body raises NameError at import, so "
            "the file collects no test at all, on any simulator or on trn2. No workaround: the tree's files "
            "are not edited.",
    evidence="scripts/nkilib_tests.py: core/qkv/test_qkv_tkg.py errors at collection with \"NameError: name "
             "'Platforms' is not defined\" (test_qkv_tkg.py:929); grep finds no import of Platforms in it.",
    where=(Where(check="nkilib_suite", case=("core/qkv/test_qkv_tkg.py",)),),
    signature=Signature(quantity="error", contains=("NameError: name 'Platforms' is not defined",)),
)

NKILIB_CORE_BARRIER_ON_SBUF = KnownIssue(
    name="nkilib-core-barrier-on-sbuf-tile",
    upstream="nki-library d2ad3a5 src/nkilib_src/nkilib/core/moe/moe_cte/bwmm_shard_on_I.py, line 577 "
             "(blockwise_mm_baseline_shard_intermediate_hybrid, MoECTEImplementation.shard_on_i_hybrid); "
             "bwmm_shard_on_I_mx.py line 756 does the same",
    summary="the dynamic loop over padded blocks increments its SBUF block index and then calls "
            "nisa.core_barrier(block_idx, (0, 1)) with that SBUF tile as data; nki.isa.core_barrier's docs (NKI "
            "0.7, Neuron 2.33): 'The data parameter represents the shared data that all cores need to "
            "synchronize on. This must be data in shared HBM that multiple cores are accessing.' The kernel "
            "breaks the documented contract (the emulator refuses it, rule core-barrier); what trn2's compiler "
            "does with it the docs do not say. No workaround: the tree's files are not edited.",
    evidence="scripts/nkilib_tests.py: core/moe/moe_cte/test_moe_cte_unified.py case impl-2 (shard_on_i_hybrid), "
             "vnc-2, fails with \"trn2 rule 'core-barrier' violated: nki.isa.core_barrier: data is in nl.sbuf\"; "
             "tests/kernels/test_nki_emu_lnc.py::test_a_barrier_on_an_sbuf_tile_is_refused.",
    where=(Where(check="nkilib_suite", case=("core/moe/moe_cte/test_moe_cte_unified.py",
                                             "core/moe/moe_cte/test_moe_bwmm_mx_cte.py")),),
    signature=Signature(quantity="error", contains=("nki.isa.core_barrier: data is in nl.sbuf",)),
)

NKILIB_GEN_MASK_TEST_OUTPUT_KEY = KnownIssue(
    name="nkilib-gen-mask-tkg-test-output-key",
    upstream="nki-library d2ad3a5 test/integration/nkilib/core/attention/test_gen_mask_tkg.py, lines 363 and 422",
    summary="the input generator names the output buffer 'mask_out_hbm.must_alias_input' (line 363), and the "
            "test's output_tensors(kernel_input) reads kernel_input['mask_out_hbm'] (line 422); "
            "test/utils/unit_test_framework.py line 177 passes it the unfiltered kernel_input, so the cases "
            "that build that buffer raise KeyError before any kernel runs, on any simulator or on trn2. No "
            "workaround: the tree's files are not edited.",
    evidence="scripts/nkilib_tests.py: 8 of core/attention/test_gen_mask_tkg.py's 12 sampled cases fail with "
             "\"KeyError: 'mask_out_hbm'\" at test_gen_mask_tkg.py:422, called from unit_test_framework.py:177, "
             "before the emulator is called.",
    where=(Where(check="nkilib_suite", case=("core/attention/test_gen_mask_tkg.py",)),),
    signature=Signature(quantity="error", contains=("KeyError: 'mask_out_hbm'",)),
)

ISSUES: tuple[KnownIssue, ...] = (
    KERNEL_ROPE_FLOAT32_ANGLES,
    KERNEL_TITAN_ROUTER_CPU_AUTOCAST,
    NKILIB_BWD_EA_GRAD_RACE,
    NKILIB_MLP_DOCSTRING_INDENT,
    NKILIB_CORE_BARRIER_ON_SBUF,
    NKILIB_GEN_MASK_TEST_OUTPUT_KEY,
    NKILIB_QKV_TKG_PLATFORMS_UNDEFINED,
)

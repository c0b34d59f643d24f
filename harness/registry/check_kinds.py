"""The kinds of check the harness makes, and the tests that make each: the one registry.

Every kind has at least one test in the default tier (what a contributor runs, and CI on every
commit: no ``slow`` mark), its cheap form; the slow tier keeps the long forms and full sizes.
Every test module of ``tests/`` belongs to at least one kind, so a module of a new kind cannot
be added without its kind, and a kind cannot be added without a default-tier test.
``tests/selftest/test_check_kinds.py`` enforces both (:func:`problems`), reading the test
modules' source (no import: the rule holds on every generation and device).

A test is named ``"tests/<path>.py::<function>"``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CheckKind:
    name: str
    what: str
    default: tuple[str, ...]  # the cheap forms: default tier
    slow: tuple[str, ...] = ()  # the long forms and full sizes


E2E, PARITY, SELF, KERNELS = "tests/e2e/", "tests/parity/", "tests/selftest/", "tests/kernels/"
TS = E2E + "test_training_state.py::"
RESUME = PARITY + "test_layout_resharded_resume.py::"

KINDS: tuple[CheckKind, ...] = (
    CheckKind("run", "a launched run completes, finite, its first-step loss as registered",
              (E2E + "test_runs.py::test_run",
               E2E + "test_assets_twin.py::test_twin_is_laid_out_as_the_hf_download",
               E2E + "test_random_init_expectation.py::test_weights_the_run_did_not_start_from_fail",
               E2E + "test_user_config.py::"
                     "test_a_config_of_a_shape_the_harness_does_not_know_is_checked_against_its_own_assets"),
              (E2E + "test_backend_registry.py::test_a_registered_backend_launches_and_is_checked",
               E2E + "test_random_init_expectation.py::"
                     "test_a_planted_forward_fails_where_the_analytic_value_cannot_see_it",
               E2E + "test_full_size_random_init_cpu.py::test_random_init_first_step_loss",
               E2E + "test_full_size_random_init_cpu.py::test_streamed_init_and_forward_equal_whole_model")),
    CheckKind("initialisation", "every rank starts step 1 from its own shard of every sharded, "
              "non-constant parameter (a random init draws them apart, a loader gives each rank "
              "its slice)",
              (E2E + "test_runs.py::test_run",
               SELF + "test_shard_fingerprints.py::test_the_known_issue_excuses_only_its_signature",
               SELF + "test_shard_fingerprints.py::"
                      "test_identical_shards_are_named_and_constant_or_replicated_ones_are_not_counted"),
              (E2E + "test_shards_distinct.py::test_the_workaround_draws_distinct_shards_equal_to_a_one_rank_init",
               E2E + "test_shards_distinct.py::test_one_replicated_shard_is_caught_and_not_excused")),
    CheckKind("training_state", "state beyond the weights through a checkpoint: resume is the "
              "uninterrupted run bit for bit; tied embeddings stay one tensor",
              (TS + "test_moe_load_balancing_through_a_checkpoint",
               TS + "test_tied_embeddings_stay_one_tensor"),
              (TS + "test_resume_reproduces_uninterrupted_run",
               TS + "test_checks_catch_expert_bias_lost_on_resume",
               TS + "test_tie_check_catches_untied_model")),
    CheckKind("load_balancing", "MoE expert_bias updated from the routing counts, applied in "
              "routing, saved and restored",
              (TS + "test_moe_load_balancing_through_a_checkpoint",),
              (TS + "test_expert_bias_updated_saved_restored",
               TS + "test_load_balancing_check_catches_planted_defect",
               TS + "test_checkpoint_check_catches_expert_bias_not_restored")),
    CheckKind("checkpoints", "HF checkpoints named, saved and reloaded as transformers expects",
              (PARITY + "test_checkpoint_conformance.py::test_trainer_save_path_writes_a_conformant_checkpoint",
               PARITY + "test_torchrun_parity.py::test_saved_checkpoint_is_complete_and_reloads",
               PARITY + "test_native_to_hf.py::test_transformers_on_the_converted_weights_computes_the_native_logits")),
    CheckKind("determinism", "a seeded rerun is the same run, bit for bit (a warm start's ranks "
              "compute what a cold start's do); a check that reads "
              "memory upstream leaves uninitialised reads poison, not leftovers",
              (TS + "test_seeded_rerun_is_bitwise_identical",
               SELF + "test_warm_start.py::"
                      "test_the_forked_rank_runs_the_workers_command_on_its_streams_and_exits_as_it_does",
               SELF + "test_warm_start.py::test_a_rank_whose_imports_could_differ_starts_cold_and_says_why",
               SELF + "test_uninitialised_memory.py::test_uninitialised_memory_is_poisoned_whatever_was_freed_before",
               PARITY + "test_hf_backend_parity.py::test_backend_rope_frequencies_are_initialised"),
              (SELF + "test_determinism.py::test_seeded_rerun_gives_bit_identical_losses",)),
    CheckKind("goldens", "the tiny dense and MoE runs' 100-step loss curves against the committed "
              "goldens of their generation and device: bit for bit where torch, torchtitan and the "
              "arithmetic are the golden's, else reported with what differs",
              (E2E + "test_goldens.py::test_every_committed_golden_is_a_torchtitan_loss_file_with_its_sidecar",
               E2E + "test_goldens.py::test_both_ci_generations_have_the_goldens_of_their_cpu_runs",
               E2E + "test_goldens.py::test_the_loss_file_parser_refuses_what_is_not_a_loss_curve",
               E2E + "test_goldens.py::test_a_golden_of_another_machine_or_stack_is_reported_not_failed",
               E2E + "test_goldens.py::test_the_curve_comparison_fails_on_a_drifted_curve",
               E2E + "test_goldens.py::test_the_template_run_begins_on_its_golden",
               E2E + "test_goldens.py::test_the_template_check_fails_on_a_golden_drifted_from_step_2"),
              (E2E + "test_goldens.py::test_the_100_step_curve_is_its_golden",
               E2E + "test_goldens.py::test_the_100_step_check_fails_on_a_golden_drifted_from_step_51")),
    CheckKind("data_path", "the trainer's batches against an independent tokenise-and-pack "
              "reference; the full-size runs read C4 from the path they name",
              (E2E + "test_data_path.py::test_config_dataloader_matches_reference",
               E2E + "test_data_path.py::test_trainer_feeds_reference_batches",
               E2E + "test_c4.py::test_a_c4_run_always_names_its_dataset_path",
               E2E + "test_c4.py::test_torchtitan_reads_the_fixture_copy_each_rank_on_its_own_shard"),
              (E2E + "test_data_path.py::test_trainer_feeds_reference_batches_flex",
               E2E + "test_data_path.py::test_trainer_check_catches_planted_defect")),
    CheckKind("sft_labels", "SFT batches with ignored labels, and the loss normalised over valid ones",
              (E2E + "test_ignored_labels.py::test_sft_batches_hold_prompt_and_padding_labels",
               E2E + "test_ignored_labels.py::test_step1_loss_normalised_over_valid_tokens"),
              (E2E + "test_ignored_labels.py::test_check_fails_on_planted_all_token_normalisation",)),
    CheckKind("parity", "same weights give the same logits, gradients, updates and curves; the "
              "main job's report says which of its runs should agree and whether they do",
              (PARITY + "test_forward_parity.py::test_dense_activations_and_logits_match",
               SELF + "test_device_bands.py::test_each_coarse_bound_catches_its_defect_and_passes_the_cpus_numerics",
               PARITY + "test_moe_routing.py::test_router_matches_reference_on_the_same_input",
               PARITY + "test_hf_backend_parity.py::test_backend_logits_match_reference",
               PARITY + "test_training_parity.py::test_three_steps_losses_grad_norms_and_lrs_match",
               PARITY + "test_torchrun_parity.py::test_native_run_follows_the_reference_trajectory",
               SELF + "test_equivalence.py::"
                      "test_backends_on_the_same_weights_agree_and_other_maskings_are_not_comparable",
               SELF + "test_equivalence.py::test_a_pair_outside_the_band_differs_and_fails_the_main_job",
               SELF + "test_equivalence.py::"
                      "test_hf_v5_against_titan_native_is_the_known_difference_within_its_signature",
               SELF + "test_equivalence.py::test_a_layout_run_is_held_to_the_fsdp_run_on_the_same_batches",
               SELF + "test_equivalence.py::test_the_registry_regime_of_each_tiny_model_is_its_architectures")),
    CheckKind("layouts", "every parallel layout (TP, CP, EP, GA, AC, compile, HSDP) trains the same "
              "model: the run's checks, the reference trajectory on its own batches, its saved "
              "updates, and the FSDP run on the same batches; a run over several nodes is the "
              "run on one; a run resumed at another world size or layout is that layout's "
              "uninterrupted run and holds the saved state; each layout's cheap form reaches "
              "the condition its class of bug needs",
              (PARITY + "test_layouts.py::test_layout_run",
               PARITY + "test_layouts.py::test_layout_follows_the_reference_trajectory",
               PARITY + "test_layouts.py::test_layout_saved_weights_are_the_reference_trajectorys",
               PARITY + "test_layouts.py::test_layout_equals_the_fsdp_run",
               PARITY + "test_layouts.py::test_moe_load_balancing_equals_the_fsdp_runs",
               PARITY + "test_layouts.py::test_an_expert_gradient_doubled_under_ep_is_caught_by_the_fsdp_run",
               PARITY + "test_layouts.py::test_a_tp_partial_sum_left_unreduced_is_caught_by_the_reference",
               PARITY + "test_layouts.py::test_routing_counts_added_twice_are_caught",
               E2E + "test_ignored_labels.py::test_gradient_accumulation_normalises_over_the_steps_valid_tokens",
               E2E + "test_ignored_labels.py::test_a_per_microbatch_loss_mean_under_gradient_accumulation_is_caught",
               E2E + "test_multinode.py::test_two_nodes_of_one_rank_are_the_two_rank_run_bit_for_bit",
               RESUME + "test_resharded_resume_is_the_uninterrupted_run",
               RESUME + "test_the_uneven_world_size_reshards_tensors_whose_dimension_does_not_split",
               RESUME + "test_the_resumed_trainer_holds_the_saved_state",
               PARITY + "test_layouts.py::test_gradient_accumulation_over_uneven_valid_tokens_is_the_single_batch",
               PARITY + "test_layouts.py::test_a_per_microbatch_mean_is_caught_by_loss_and_gradients",
               PARITY + "test_layouts.py::test_full_ac_on_the_moe_equals_no_ac",
               PARITY + "test_layout_conditions.py::"
                      "test_every_layout_names_its_condition_and_the_default_tier_case_reaching_it",
               PARITY + "test_layout_conditions.py::test_a_layout_whose_cheap_form_does_not_reach_its_condition_fails",
               PARITY + "test_layout_commands.py::test_a_compiling_layout_compiles_through_the_devices_backend",
               PARITY + "test_layout_commands.py::test_a_full_size_layout_runs_its_twins_degrees_on_the_assets_twin"),
              (E2E + "test_multinode.py::test_hsdp_over_two_nodes_equals_the_one_node_hsdp_run",
               RESUME + "test_a_reshard_that_drops_a_row_of_an_uneven_dimension_is_caught",
               RESUME + "test_a_load_that_loses_a_row_in_both_runs_is_caught_by_the_state_alone",
               PARITY + "test_layouts.py::test_a_per_microbatch_normalised_backward_is_caught_by_the_gradients_alone",
               PARITY + "test_layouts.py::test_a_moe_forward_that_reads_its_counts_on_recompute_is_caught")),
    CheckKind("config_conformance", "native configs against the HF config.json they load",
              (PARITY + "test_config_conformance.py::test_native_config_conforms_to_config_json",
               E2E + "test_backend_configs.py::test_native_model_has_the_hf_models_parameter_count",
               E2E + "test_user_config.py::test_a_wrong_rope_theta_fails_the_lint_naming_field_values_and_file"),
              (E2E + "test_user_config.py::test_the_cli_runs_a_user_config_with_the_registrys_verdict",
               E2E + "test_user_config.py::test_pytest_runs_a_user_config_through_the_run_template",
               E2E + "test_user_config.py::test_compare_native_flex_and_the_transformers_backend_with_its_workaround")),
    CheckKind("kernels", "every kernel against a float64-capable reference, forward and backward",
              (KERNELS + "test_conformance.py::test_conformance",
               KERNELS + "test_custom_ops.py::test_opcheck",
               KERNELS + "test_references.py::test_reference_gradcheck_float64",
               KERNELS + "test_twins.py::test_every_kernel_of_every_op_has_its_twin_with_the_same_signature",
               KERNELS + "test_compare.py::test_rule1_accepts_bf16_rounding_and_catches_one_wrong_element",
               KERNELS + "test_model_swap.py::test_swapped_model_matches_torchtitan_exactly",
               KERNELS + "test_known_issues_kernel.py::test_router_cell_with_only_the_recorded_dtype_failure_is_known",
               KERNELS + "test_tooling.py::test_list_names_every_op_and_says_why_skipped",
               KERNELS + "test_neuron.py::test_nki_kernels_are_registered_for_the_neuron_device",
               KERNELS + "test_nki_emu.py::test_seam_installs_the_emulator_as_nki_and_restores_what_was_there",
               KERNELS + "test_nki_emu_validation.py::"
                         "test_nki_library_kernel_on_the_emulator_matches_its_own_reference",
               KERNELS + "test_nki_emu_semantics.py::test_same_dtype_copies_are_bit_exact_for_int32",
               KERNELS + "test_nki_emu_lnc.py::test_the_same_kernel_without_its_barrier_is_a_race",
               KERNELS + "test_nkilib_suite.py::test_the_cpu_simulator_package_holds_what_simulation_setup_imports",
               KERNELS + "test_moe_blockwise.py::test_layout_puts_every_row_in_a_block_of_its_expert",
               KERNELS + "test_moe_blockwise_cost.py::test_the_kernel_at_the_source_shape_keeps_every_bound",
               KERNELS + "test_moe_backward.py::test_nki_backward_on_the_emulator_matches_float64_and_torchtitan",
               KERNELS + "test_nki_emu_moe_instructions.py::"
                         "test_programs_meet_at_the_barrier_and_read_what_the_other_wrote",
               KERNELS + "test_nki_emu_core_kernels.py::"
                         "test_nki_object_dataclasses_take_plain_class_attributes_by_keyword",
               KERNELS + "test_lnc2_split.py::test_rope_splits_its_tiles_across_the_two_programs",
               KERNELS + "test_trn2_session.py::"
                         "test_a_rehearsal_writes_the_report_with_every_kernel_compared_and_timed"),
              (KERNELS + "test_moe_backward.py::test_nki_backward_at_the_30b_a3b_cut_matches_float64_and_torchtitan",
               KERNELS + "test_moe_blockwise_cost.py::"
                         "test_at_the_30b_a3b_cut_our_forward_beats_nki_librarys_on_flops_dma_and_sbuf",
               KERNELS + "test_trn2_session.py::test_the_script_rehearses_on_cpu_and_exits_zero",
               KERNELS + "test_nkilib_suite.py::test_nki_librarys_rope_hf_tests_pass_on_the_emulator")),
    CheckKind("known_issues", "the checks fail on broken results; a known issue excuses only its "
              "own signature",
              (SELF + "test_checks_catch_defects.py::test_known_issue_is_accepted_only_with_its_recorded_signature",
               SELF + "test_checks_catch_defects.py::test_catches_a_first_step_loss_just_outside_tolerance",
               E2E + "test_assets_twin.py::test_an_inherited_issue_that_reproduces_is_expected_and_named_inherited"),
              (SELF + "test_sensitivity.py::test_first_step_expectation_catches",)),
    CheckKind("plants", "defects planted in the system under test are caught",
              (SELF + "test_plants.py::test_every_plant_is_shown_caught_by_a_test",
               PARITY + "test_checks_catch_planted.py::test_conformance_catches_a_dropped_tensor")),
    CheckKind("failure_handling", "crashes, hangs and NaN fail clearly; nothing launched outlives "
              "the session",
              (SELF + "test_checks_catch_defects.py::test_catches_a_crash_and_a_timeout",
               SELF + "test_leftover_sweep.py::test_finds_what_this_session_launched_and_nothing_else",
               SELF + "test_child_environment.py::test_every_child_carries_the_session_marker_and_this_tree",
               SELF + "test_metrics_sink.py::test_nonfinite_loss_is_written_then_stops_the_run"),
              (SELF + "test_failure_handling.py::test_hung_rank_is_killed_at_the_timeout",
               SELF + "test_failure_handling.py::test_hung_rank_leaves_no_process_behind",
               SELF + "test_failure_handling.py::test_hung_rank_failure_shows_every_rank_log",
               SELF + "test_failure_handling.py::test_crashed_rank_traceback_is_shown",
               SELF + "test_failure_handling.py::test_nan_loss_stops_the_run_at_the_first_bad_step",
               SELF + "test_failure_handling.py::test_two_runs_in_parallel_do_not_collide")),
    CheckKind("inputs", "broken inputs refused before any rank starts; fixtures regenerate bit "
              "for bit",
              (SELF + "test_preflight.py::test_launch_refuses_before_starting_ranks",
               E2E + "test_multinode.py::test_nodes_that_do_not_divide_the_ranks_are_refused_before_launch",
               E2E + "test_fixtures.py::test_corpus_and_tokenizer_regenerate_bit_identically",
               E2E + "test_fixtures.py::test_the_loss_contract_in_float32_recomputes_the_recorded_losses"),
              (E2E + "test_fixtures.py::test_pretrained_checkpoints_regenerate_bit_identically",)),
    CheckKind("harness_setup", "the registry, shims, workflows and tiers the harness runs on",
              (E2E + "test_backend_registry.py::test_a_registered_backend_is_instantiated_on_every_device",
               SELF + "test_upstream_shims.py::test_generation_names",
               SELF + "test_startup_gc.py::test_a_launched_rank_imports_with_collection_off_until_its_trainer_is_built",
               SELF + "test_rank_observers.py::test_every_rank_boots_with_every_observer_on_every_device",
               E2E + "test_workflows.py::test_workflows_pass_linter",
               SELF + "test_parallel_tier.py::test_a_run_launched_twice_is_found",
               SELF + "test_parallel_tier.py::test_workers_for_a_selection",
               SELF + "test_prefetch.py::test_the_runs_prefetched_are_the_ones_the_collected_tests_read_in_their_order",
               SELF + "test_prefetch.py::test_a_run_launched_ahead_that_no_test_reads_is_named",
               SELF + "test_import_graph.py::test_harness_has_no_import_cycle",
               SELF + "test_named_once.py::test_every_harness_variable_is_named_in_the_environment_module_only",
               SELF + "test_lint.py::test_the_code_meets_the_projects_lint_rules",
               E2E + "test_assets_twin.py::test_fork_is_its_own_generation",
               SELF + "test_check_kinds.py::test_every_kind_has_a_default_tier_test",
               SELF + "test_doc_links.py::test_every_relative_link_in_the_readme_and_docs_resolves",
               SELF + "test_nightly.py::test_the_2_33_dlami_venv_is_found_by_its_own_name_newest_first",
               SELF + "test_nightly_preflight.py::"
                      "test_without_a_neuron_device_it_fails_naming_what_is_missing_with_each_fix",
               SELF + "test_own_process.py::test_marked_tests_run_each_in_a_child_and_report_as_it_saw_them",
               SELF + "test_supported_stack.py::test_a_session_or_command_on_torch_2_11_stops_with_that_line",
               SELF + "test_upstream_pins.py::test_a_mirrored_artifact_is_taken_only_with_the_pins_sha256"),
              (SELF + "test_parallel_tier.py::test_a_run_read_on_two_workers_launches_once",)),
    CheckKind("diagnosis", "a failing run says where: its first divergent module, the hints whose "
              "signature fits, and what changed against a baseline report",
              (SELF + "test_diagnosis.py::test_the_diagnosis_names_the_planted_module",
               SELF + "test_diagnosis.py::test_a_clean_model_has_no_divergent_module",
               SELF + "test_baseline.py::test_a_planted_run_is_matched_to_the_clean_run_and_its_module_named",
               SELF + "test_run_report.py::"
                      "test_the_report_holds_the_verdicts_the_tests_recorded_after_the_checkpoints_are_gone",
               E2E + "test_runs_vs_baseline.py::test_vs_baseline"),
              (SELF + "test_diagnosis.py::test_a_launched_run_with_a_plant_names_its_module_in_summary_md",
               E2E + "test_baseline_cli.py::test_two_clean_reports_flag_nothing",
               E2E + "test_baseline_cli.py::test_a_planted_defect_is_flagged_with_run_step_and_module")),
)


def kind(name: str) -> CheckKind:
    for entry in KINDS:
        if entry.name == name:
            return entry
    raise KeyError(f"no check kind {name!r}; known: {[k.name for k in KINDS]} (harness/registry/check_kinds.py)")


def _tests_of(path: Path) -> dict[str, bool]:
    """function name -> whether it is marked slow (itself or its module's ``pytestmark``)."""
    tree = ast.parse(path.read_text())
    module_slow = any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "pytestmark"
                                                         for t in n.targets)
                      and "slow" in ast.unparse(n.value) for n in tree.body)
    return {n.name: module_slow or any("mark.slow" in ast.unparse(d) for d in n.decorator_list)
            for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def problems(kinds: tuple[CheckKind, ...] = KINDS, root: Path | None = None) -> list[str]:
    """Everything that breaks the rule: a kind without a default-tier test; a named test that
    does not exist or sits in the wrong tier; a test module no kind names."""
    root = root or Path(__file__).resolve().parents[2]
    found: list[str] = []
    cache: dict[Path, dict[str, bool]] = {}
    claimed: set[str] = set()
    names = [k.name for k in kinds]
    if len(set(names)) != len(names):
        found.append(f"a check kind is listed twice: {names}")
    for entry in kinds:
        if not entry.default:
            found.append(f"check kind {entry.name!r} has no default-tier test (add its cheap form, "
                         "not marked slow, to harness/registry/check_kinds.py)")
        for tier, tests, want_slow in (("default", entry.default, False), ("slow", entry.slow, True)):
            for node in tests:
                file, _, function = node.partition("::")
                path = root / file
                claimed.add(file)
                if not path.is_file():
                    found.append(f"{entry.name}: {node}: no such test module")
                    continue
                tests_here = cache.setdefault(path, _tests_of(path))
                if function not in tests_here:
                    found.append(f"{entry.name}: {node}: no such test function")
                elif tests_here[function] != want_slow:
                    found.append(f"{entry.name}: {node} is listed in the {tier} tier but is "
                                 f"{'marked slow' if tests_here[function] else 'not marked slow'}")
    for path in sorted((root / "tests").rglob("test_*.py")):
        file = path.relative_to(root).as_posix()
        if file not in claimed and _tests_of(path):
            found.append(f"{file}: its tests belong to no check kind (name its kind, or a new one "
                         "with a default-tier test, in harness/registry/check_kinds.py)")
    return found

"""Checkpoint conformance, in-process: torchtitan's state-dict adapter and HF save path.

The expected checkpoint is what transformers' own ``save_pretrained`` writes for the config
(harness/parity/conformance/checkpoint.py). A tensor torchtitan cannot name in HF terms fails, unless it
is in the data allow-list ``harness/parity/conformance/expected_unmapped_keys.toml`` (the MoE
``expert_bias_E`` buffer).

Each check is ``checkpoint_conformance`` for its fixture: where a known adapter defect applies
(``spring2026-qwen3-moe-adapter-expert-keys``: the routed experts mapped to names the model
does not have), it is an xfail naming it only when every violated key is a routed expert's.
"""

from __future__ import annotations

import pytest

from harness.parity import compare
from harness.parity.conformance import checkpoint as C
from harness.references.model import load_hf_tensors
from harness.registry import known_issues
from harness.upstream import titan_api


@pytest.fixture(scope="module")
def allow():
    return C.load_allow_list()


def _native(family, dense_models, moe_models):
    return (dense_models if family == "dense" else moe_models)["native"]


FAMILIES = ["dense", "moe"]
SUBJECT = {"dense": "tiny_dense", "moe": "tiny_moe"}


def assert_conformant(family: str, keys: list[str], message: str, workarounds) -> None:
    """``keys``: the violated keys (none: conformant); ``message``: the failure's text."""
    problem = message if keys else None
    verdict = known_issues.judge("checkpoint_conformance", problem,
                                 {"keys_outside_routed_experts": C.keys_outside_routed_experts(keys)},
                                 workarounds, subject=SUBJECT[family], generation=titan_api.generation())
    known_issues.settle(verdict, problem)


@pytest.mark.parametrize("family", FAMILIES)
def test_initial_load_reads_every_checkpoint_tensor_and_writes_every_parameter(
        family, dense_models, moe_models, allow, workarounds):
    """The trainer's initial_load_in_hf path: no checkpoint tensor ignored, no native tensor
    left at its initial value (allow-listed buffers aside)."""
    rep = _native(family, dense_models, moe_models).load_report
    found = [("checkpoint tensor never requested by to_hf (silently ignored)", k)
             for k in sorted(rep.unread_file_keys)]
    found += [("native tensor not written by from_hf (keeps its init value)", k)
              for k in sorted(rep.native_keys_not_loaded) if not C.is_allowed(k, allow)]
    found += [("load_state_dict reports missing", k) for k in rep.missing_on_load
              if not C.is_allowed(k, allow)]
    found += [("load_state_dict reports unexpected", k) for k in rep.unexpected_on_load]
    assert_conformant(family, [k for _, k in found],
                      compare.parity_message(*(f"{what}: {k}" for what, k in found)), workarounds)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_native_tensor_has_an_hf_name(family, dense_models, moe_models, allow, workarounds):
    model = _native(family, dense_models, moe_models)
    violations, _ = C.unmapped_native_keys(model.adapter, dict(model.module.state_dict()), allow)
    assert_conformant(family, [v.key for v in violations],
                      compare.parity_message(C.format_violations("to_hf coverage", violations)), workarounds)


def test_allow_list_entries_are_still_needed(moe_models, allow):
    """Each allow-list entry matches a tensor that really is unmapped (no stale entries)."""
    model = moe_models["native"]
    _, seen = C.unmapped_native_keys(model.adapter, dict(model.module.state_dict()), allow)
    unused = [a.pattern for a in allow if not any(C.is_allowed(k, [a]) for k in seen)]
    assert not unused, f"allow-list entries that match no unmapped tensor: {unused}"


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_round_trip_is_exact(family, dense_models, moe_models, allow, workarounds):
    model = _native(family, dense_models, moe_models)
    violations = C.adapter_round_trip_violations(model.adapter, dict(model.module.state_dict()), allow)
    assert_conformant(family, [v.key for v in violations],
                      compare.parity_message(C.format_violations("from_hf(to_hf(.))", violations)), workarounds)


@pytest.mark.parametrize("family", FAMILIES)
def test_to_hf_names_and_shapes_are_transformers(family, dense_models, moe_models, dense_dir, moe_dir,
                                                workarounds):
    model = _native(family, dense_models, moe_models)
    directory = dense_dir if family == "dense" else moe_dir
    violations = C.hf_names_violations(model.adapter, dict(model.module.state_dict()), directory)
    assert_conformant(family, [v.key for v in violations],
                      compare.parity_message(C.format_violations("to_hf vs transformers", violations)), workarounds)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, dense_models, moe_models):
    """Each native model (loaded from its fixture) saved through torchtitan's HF save path."""
    out = {}
    for family, models in (("dense", dense_models), ("moe", moe_models)):
        d = tmp_path_factory.mktemp(f"saved-{family}")
        native = models["native"]
        C.save_like_trainer(native.module, native.adapter, d)
        out[family] = d
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_save_path_writes_a_conformant_checkpoint(family, saved, dense_dir, moe_dir, workarounds):
    directory = dense_dir if family == "dense" else moe_dir
    violations = C.checkpoint_violations(saved[family], config_dir=directory)
    listing = C.list_checkpoint(saved[family])
    note = (f"note: {len(listing.extra_safetensors)} .safetensors in subdirectories "
            f"(DCP staging left by the save): {listing.extra_safetensors}") if listing.extra_safetensors else ""
    assert_conformant(family, [v.key for v in violations],
                      compare.parity_message(C.format_violations(str(saved[family]), violations), note), workarounds)


@pytest.mark.parametrize("family", FAMILIES)
def test_load_then_save_gives_back_the_checkpoint_bit_for_bit(family, saved, dense_dir, moe_dir, workarounds):
    directory = dense_dir if family == "dense" else moe_dir
    violations = C.tensor_equality_violations(saved[family], load_hf_tensors(directory))
    assert_conformant(family, [v.key for v in violations],
                      compare.parity_message(C.format_violations("fixture -> native -> HF", violations)), workarounds)


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_checkpoint_reloads_in_transformers_without_missing_or_unexpected_keys(
        family, saved, dense_dir, moe_dir, tmp_path, workarounds):
    """from_pretrained of the trainer-saved checkpoint (config.json added) reports no missing,
    unexpected or mismatched keys. (Its logits are not compared: the tensors are bit-for-bit
    the fixture's, test above, so they could not differ.)"""
    directory = dense_dir if family == "dense" else moe_dir
    loadable = C.with_config(saved[family], directory, tmp_path / "loadable")
    _, violations = C.reload_report(loadable)
    assert_conformant(family, [v.key for v in violations],
                      compare.parity_message(C.format_violations("from_pretrained", violations)), workarounds)


def test_tied_embeddings_follow_the_transformers_convention(saved, dense_models, tmp_path):
    """tie_word_embeddings: the native model's lm_head is its embedding (one tensor), and
    torchtitan's save writes exactly the key set transformers' own save_pretrained writes for
    the tied model (no lm_head.weight). What transformers does on reload is not checked here:
    from_pretrained re-ties whatever the file holds."""
    hf_dir = tmp_path / "hf_save"
    dense_models["hf"].module.save_pretrained(str(hf_dir))
    problems = C.tied_embedding_violations(dense_models["native"].module,
                                           set(C.list_checkpoint(saved["dense"]).tensors),
                                           set(C.list_checkpoint(hf_dir).tensors))
    assert not problems, compare.parity_message(*problems)

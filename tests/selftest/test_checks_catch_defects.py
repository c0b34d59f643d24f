"""The checks of a run fail on broken runs, and known issues excuse only their own signature
(fabricated results; no launch needed).

Specification of how a test excuses a known issue, the one idiom: a check's verdict against
the registry (``known_issues.judge``, or a producer of such a verdict: ``checks.verdict``,
``compare.judge_parity``, the kernel runner's ``outcome``), then ``known_issues.settle`` on it.
No file under tests/ (nor the root conftest.py) excuses a known issue another way: no xfail of
its own (``pytest.xfail``, ``pytest.mark.xfail``), none of the retired helpers (``enforce``,
``xfail_if_known``), and no skip whose reason names a known issue or speaks of one.
"""

import ast
import re
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.checks import run_checks as checks
from harness.device.devices import profile_for
from harness.launch.run import RunSpec, build_command
from harness.launch.subjects import Facts
from harness.references.expected_loss import expected_loss, lm_head_std
from harness.registry import known_issues, paths
from harness.registry.expectations import ExpectationRegistry, MissingExpectation
from harness.registry.known_issues import hf_backend, kernels, native_qwen3, neuron, pytorch, spring2026
from harness.results.run_result import RunResult, StepRecord

EXPECTED = expected_loss("titan_native", "tiny_dense", "pretrained", "cpu", "row_causal", 2)


def _run(losses, returncode=0, timed_out=False, backend="titan_native", init="pretrained",
         grad_norm=1.0, spec=None) -> RunResult:
    steps = [StepRecord(step=i + 1, loss=loss, grad_norm=grad_norm, tokens_per_s=1.0,
                        step_time_s=1.0, peak_memory_gib=1.0) for i, loss in enumerate(losses)]
    spec = spec or RunSpec(backend, init=init)
    return RunResult(spec=spec, device="cpu", nproc=2, layout="fsdp", degrees=spec.parallel_degrees(2),
                     command=["torchrun"], returncode=returncode, timed_out=timed_out,
                     duration_s=1.0, run_dir=Path("/nonexistent"), steps=steps)


def _problem(check, run, steps):
    return checks.RUN_CHECKS[check](run, steps).problem


def test_a_healthy_run_passes():
    run = _run([EXPECTED.value, 1.0, 0.9])
    for check in ("completed", "finite", "first_step_loss"):
        assert _problem(check, run, 3) is None, check


def test_catches_a_missing_step():
    assert _problem("completed", _run([1.0, 1.0]), 3) == "logged steps [1, 2], expected 1..3"


STEP_1 = "/runs/first/dump/checkpoint/step-1"


def test_a_run_resumed_from_step_k_is_complete_with_steps_k_plus_1_on(tmp_path):
    spec = RunSpec("titan_native", init="random", steps=3, resume_from=STEP_1, resume_step=1)
    resumed = _run([1.0, 1.0], spec=spec)
    for i, step in enumerate(resumed.steps):
        resumed.steps[i] = replace(step, step=i + 2)
    assert spec.first_step == 2
    assert _problem("completed", resumed, 3) is None
    assert _problem("completed", replace(resumed, steps=resumed.steps[:1]), 3) == \
        "logged steps [2], expected 2..3"
    # the launch loads the whole training state, not the model only
    command = build_command(spec, profile_for("cpu"), tmp_path)
    at = command.index(STEP_1)
    assert command[at - 1:at + 2] == ["--checkpoint.initial_load_path", STEP_1,
                                      "--checkpoint.no-initial-load-model-only"], command
    # a pretrained run's initial load (HF weights, model only) is no resume
    pretrained = _run([1.0, 1.0])
    assert pretrained.spec.first_step == 1 and "--checkpoint.no-initial-load-model-only" not in \
        build_command(pretrained.spec, profile_for("cpu"), tmp_path)
    assert _problem("completed", pretrained, 2) is None
    with pytest.raises(ValueError, match="the step it was saved at"):
        RunSpec("titan_native", resume_from=STEP_1)


def test_catches_a_crash_and_a_timeout():
    assert "exited with code 1" in _problem("completed", _run([1.0], returncode=1), 1)
    assert "timed out" in _problem("completed", _run([1.0], timed_out=True), 1)


def test_catches_every_nonfinite_loss_and_grad_norm():
    problem = _problem("finite", _run([1.0, float("nan"), float("inf")]), 3)
    assert "step 2: loss nan" in problem and "step 3: loss inf" in problem
    assert "grad norm nan" in _problem("finite", _run([1.0], grad_norm=float("nan")), 1)


def test_catches_a_first_step_loss_just_outside_tolerance():
    problem = _problem("first_step_loss", _run([EXPECTED.value + 2 * EXPECTED.tolerance]), 1)
    assert problem and "recorded_fp32" in problem


def test_catches_a_nan_first_step():
    assert _problem("first_step_loss", _run([float("nan")]), 1)


def test_the_recorded_value_depends_on_the_mask_and_the_data_parallel_degree():
    registry = ExpectationRegistry()
    values = {(mask, dp): registry.rule("titan_native", "tiny_dense", "pretrained", "cpu", mask, dp).value
              for mask in ("row_causal", "document") for dp in (1, 2)}
    assert len(set(values.values())) == 4, values
    with pytest.raises(MissingExpectation, match="data-parallel degree 3"):
        registry.rule("titan_native", "tiny_dense", "pretrained", "cpu", "row_causal", 3)


def test_missing_expectation_names_the_key():
    with pytest.raises(MissingExpectation, match="backend='hf_v5' model='tiny_moe'"):
        ExpectationRegistry().rule("hf_v5", "tiny_moe", "random", "cpu")


def test_a_run_without_expectation_fails_with_the_observed_value_and_how_to_record_it():
    moe_weights = Facts(module="m", config="c", kind="titan_native", model="tiny_moe",
                        model_dir=paths.TINY_MOE, assets_dir=paths.TINY_MOE, init="pretrained",
                        weights_dir=paths.TINY_MOE, precision="float32", attention="sdpa",
                        mask="row_causal", parameters=0)
    run = replace(_run([3.25], spec=RunSpec.for_subject(moe_weights)), device="cuda")  # native dense code, MoE weights
    problem = _problem("first_step_loss", run, 1)
    assert "no expectation" in problem and "3.250000" in problem and "record it" in problem


def test_device_specific_expectation_is_not_used_elsewhere():
    """The source's published 12.43 was measured on neuron: a CPU run of the same model, init
    and data has no published number (and is held to its own expectations only)."""
    neuron = replace(_run([12.43], spec=RunSpec("titan_native", size="full", init="random", data="c4")),
                     device="neuron")
    assert neuron.spec.model == "Qwen3-4B-Instruct-2507"
    assert ExpectationRegistry().published(neuron).value == 12.43
    assert ExpectationRegistry().published(replace(neuron, device="cpu")) is None


# --- known issues are matched by signature ---------------------------------------------------

TIED = known_issues.issue("hf_v5-tied-embedding-init-scale")


def _hf_random(deviation):
    expected = expected_loss("hf_v5", "tiny_dense", "random", "cpu")
    return _run([expected.value + deviation], backend="hf_v5", init="random")


def test_known_issue_is_accepted_only_with_its_recorded_signature():
    inside = (TIED.signature.low + TIED.signature.high) / 2
    verdict, _ = checks.verdict("first_step_loss", _hf_random(inside), 1)
    assert verdict.status == "known" and verdict.issues == (TIED,)


@pytest.mark.parametrize("deviation", [-3.7, 0.5, 9.0, float("nan")])
def test_known_issue_does_not_absorb_another_failure(deviation):
    verdict, _ = checks.verdict("first_step_loss", _hf_random(deviation), 1)
    assert verdict.status == "fail" and "not as known issue" in verdict.message


def test_known_issue_that_stops_showing_fails_as_stale():
    verdict, _ = checks.verdict("first_step_loss", _hf_random(0.0), 1)
    assert verdict.status == "fail" and "delete the entry" in verdict.message


def test_known_issue_applies_only_where_recorded():
    verdict, _ = checks.verdict("first_step_loss", _run([EXPECTED.value + 3.7]), 1)
    assert verdict.status == "fail" and not verdict.issues


def test_a_name_recorded_twice_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"known issue name\(s\) \['hf_v5-tied-embedding-init-scale'\] recorded twice"):
        known_issues.Registry((TIED, replace(TIED, summary="another")))
    other = replace(TIED, name="another", workaround=replace(known_issues.workaround("hf_rope_init")))
    with pytest.raises(ValueError, match=r"workaround name\(s\) \['hf_rope_init'\] recorded twice"):
        known_issues.Registry((known_issues.issue("hf_v5-rope-inv-freq-uninitialised"), other))


ENTRY_MODULES = (hf_backend, native_qwen3, kernels, pytorch, spring2026, neuron)


def unlisted_entries(module: types.ModuleType) -> list[str]:
    """The known issues ``module`` defines but leaves out of its ``ISSUES`` (they never apply)."""
    listed = {id(i) for i in module.ISSUES}
    return sorted(name for name, value in vars(module).items()
                  if isinstance(value, known_issues.KnownIssue) and id(value) not in listed)


def test_every_entry_is_in_the_registry_and_reachable_by_name():
    assert [unlisted_entries(m) for m in ENTRY_MODULES] == [[]] * len(ENTRY_MODULES)
    assert known_issues.ISSUES == tuple(i for m in ENTRY_MODULES for i in m.ISSUES)
    assert all(known_issues.issue(i.name) is i for i in known_issues.ISSUES)


def test_an_entry_left_out_of_its_modules_issues_is_found():
    module = types.ModuleType("planted_entries")
    module.LISTED, module.FORGOTTEN = TIED, replace(TIED, name="forgotten")
    module.ISSUES = (module.LISTED,)
    assert unlisted_entries(module) == ["FORGOTTEN"]


def test_settle_goes_on_on_a_pass_xfails_naming_the_issue_and_fails_with_the_message():
    with pytest.raises(pytest.xfail.Exception, match=r"\[hf_v5-tied-embedding-init-scale\].*Observed: too high"):
        known_issues.settle(known_issues.Verdict("known", "known issue(s) ...", (TIED,)), "too high")
    with pytest.raises(pytest.fail.Exception, match="not as known issue\nthe run: x"):
        known_issues.settle(known_issues.Verdict("fail", "not as known issue", (TIED,)), "p", "the run: x")
    assert known_issues.settle(known_issues.Verdict("pass"), None) is None


def test_an_unknown_workaround_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match="unknown workaround 'hf_rope_int'.*hf_rope_init"):
        RunSpec("hf_v5", workarounds=("hf_rope_int",))


# --- a test excuses a known issue one way only: known_issues.settle on a verdict --------------

RETIRED = ("enforce", "xfail_if_known")  # the helpers ``settle`` replaced
OWN_XFAIL_CALL, OWN_XFAIL_MARK = "pytest.xfail", "pytest.mark.xfail"
SKIPS = ("pytest.skip", "pytest.mark.skip", "pytest.mark.skipif", "pytest.importorskip")
SPEAKS_OF_A_KNOWN_ISSUE = re.compile(
    r"\b(known (upstream )?issues?|upstream (defects?|bugs?)|defects?|bugs?|wrong|broken|loses|lost|"
    r"workarounds?)\b", re.IGNORECASE)
NAMES = tuple(i.name for i in known_issues.ISSUES) + tuple(known_issues.WORKAROUNDS)


def _reason(call: ast.Call) -> str:
    """The text of a skip: every string constant in its arguments (f-strings' too)."""
    return " ".join(node.value for node in ast.walk(call)
                    if isinstance(node, ast.Constant) and isinstance(node.value, str))


def excuses_outside_the_registry(source: str, filename: str = "<test>") -> list[str]:
    """Each place in ``source`` that excuses a known issue other than by ``known_issues.settle``,
    as ``file:line: what``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if (isinstance(node, ast.Call) and ast.unparse(node.func) == OWN_XFAIL_CALL
                or isinstance(node, ast.Attribute) and ast.unparse(node) == OWN_XFAIL_MARK):
            found.append(f"{where}: {ast.unparse(node)[:60]} (only known_issues.settle xfails)")
        elif isinstance(node, ast.Attribute) and node.attr in RETIRED:
            found.append(f"{where}: {ast.unparse(node)} (retired: use known_issues.settle)")
        elif isinstance(node, ast.ImportFrom) and any(a.name in RETIRED for a in node.names):
            found.append(f"{where}: imports {[a.name for a in node.names if a.name in RETIRED]} (retired)")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in SKIPS:
            reason = _reason(node)
            if SPEAKS_OF_A_KNOWN_ISSUE.search(reason) or any(n in reason for n in NAMES):
                found.append(f"{where}: {ast.unparse(node.func)}({reason!r}) skips for a known "
                             "issue: judge the check and settle on its verdict")
    return found


def test_no_test_excuses_a_known_issue_outside_the_registry():
    files = sorted((paths.REPO_ROOT / "tests").rglob("*.py")) + [paths.REPO_ROOT / "conftest.py"]
    found = [line for path in files for line in
             excuses_outside_the_registry(path.read_text(), str(path.relative_to(paths.REPO_ROOT)))]
    assert not found, "known issues excused outside known_issues.settle:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    'pytest.xfail("the adapter drops the experts")',
    '@pytest.mark.xfail(reason="flaky")\ndef test_x():\n    pass',
    '@pytest.mark.xfail\ndef test_x():\n    pass',
    'known_issues.xfail_if_known(verdict, problem)',
    'known_issues.enforce("completed", problem, {})',
    'checks.enforce("completed", run, 2)',
    'from harness.registry.known_issues import xfail_if_known',
    'pytest.skip("the adapter\'s expert keys are wrong on spring-2026 only")',
    'pytest.skip(f"known issue {name}: not comparable")',
    '@pytest.mark.skipif(SPRING, reason="spring2026-qwen3-moe-adapter-expert-keys")\ndef test_x():\n    pass',
    'pytest.param(1, marks=pytest.mark.skip(reason="needs hf_block_causal"))',
], ids=["xfail", "xfail_mark", "bare_xfail_mark", "xfail_if_known", "enforce", "checks_enforce",
        "import_retired", "skip_wording", "skip_fstring", "skipif_issue_name", "param_workaround"])
def test_each_other_way_of_excusing_a_known_issue_is_found(source):
    assert len(excuses_outside_the_registry(source)) == 1, source


def test_the_idiom_and_skips_for_absent_things_are_not_excuses():
    source = """
verdict = known_issues.judge("completed", problem, observed, workarounds, backend="hf_v5")
known_issues.settle(verdict, problem)
pytest.skip("nki-library's wheel is not installed (package nkilib_src)")
pytest.mark.skipif(generation() != "v0_3", reason="torchtitan 0.3.0 only (the v0_3 generation)")
CHILD = 'pytest.xfail("expected in the child")'
with pytest.raises(pytest.xfail.Exception):
    known_issues.settle(verdict, problem)
"""
    assert excuses_outside_the_registry(source) == []


# --- the saved HF checkpoint reloads completely ------------------------------------------------


def test_checkpoint_reload_passes_on_a_complete_checkpoint():
    assert checks._reload_problems(paths.TINY_DENSE, paths.TINY_DENSE).problem is None


def test_checkpoint_reload_catches_a_dropped_key(tmp_path):
    tensors = load_file(paths.TINY_DENSE / "model.safetensors")
    dropped = "model.layers.1.self_attn.k_norm.weight"
    del tensors[dropped]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    problem = checks._reload_problems(tmp_path, paths.TINY_DENSE).problem
    assert problem and "missing keys (1)" in problem and dropped in problem


def test_checkpoint_reload_catches_a_checkpoint_of_another_architecture():
    problem = checks._reload_problems(paths.TINY_DENSE, paths.TINY_MOE).problem
    # every kind at once: the dense MLP's keys unexpected, the experts' missing, and the
    # attention projections mis-shaped (the MoE fixture has 8 heads, the dense one 4)
    assert problem and all(kind in problem for kind in ("missing keys", "unexpected keys",
                                                          "mismatched shapes"))


# --- the analytic random-init expectation uses the std the init really draws ----------------

def test_a_truncated_init_rule_is_the_std_torch_draws():
    """``trunc3(hidden^-0.5)`` is ``nn.init.trunc_normal_(std=s, a=-3s, b=3s)``'s std (0.9866 s),
    not s: spring-2026's and the transformers backend's output init."""
    hidden = 2048
    s = hidden ** -0.5
    drawn = torch.nn.init.trunc_normal_(torch.empty(4_000_000, dtype=torch.float64),
                                        std=s, a=-3 * s, b=3 * s,
                                        generator=torch.Generator().manual_seed(0)).std().item()
    assert abs(lm_head_std("trunc3(hidden^-0.5)", hidden) / drawn - 1) < 1e-3
    assert abs(lm_head_std("hidden^-0.5", hidden) / drawn - 1) > 1e-2  # the untruncated rule is off


@pytest.mark.parametrize("log, first", [
    ("[rank0]: ValueError: bad config\n[rank0]: RuntimeError: later\n", "ValueError: bad config"),
    # DCP's wrapper names no cause; the rank's own traceback follows it in the log
    ("[rank1]: torch.distributed.checkpoint.api.CheckpointException: CheckpointException "
     "ranks:dict_keys([1])\nTraceback (most recent call last):\n[rank1]: RuntimeError: Missing "
     "key in checkpoint state_dict: lm_head.weight.\n",
     "RuntimeError: Missing key in checkpoint state_dict: lm_head.weight."),
    ("[rank1]: CheckpointException: CheckpointException ranks:dict_keys([1])\n",
     "CheckpointException: CheckpointException ranks:dict_keys([1])"),
], ids=["the-first", "the-cause-a-wrapper-names-not", "a-wrapper-alone"])
def test_a_runs_first_error_is_its_first_cause(tmp_path, log, first):
    (tmp_path / "stderr.log").write_text(log)
    result = RunResult(spec=RunSpec("hf_v5"), device="cpu", nproc=2, layout="fsdp", degrees={},
                       command=[], returncode=1, timed_out=False, duration_s=1.0,
                       run_dir=tmp_path, rank_logs={0: [tmp_path / "stderr.log"]})
    assert result.first_error() == first

"""A user's own config file is a subject like the built-in backends (the source's walkthrough).

Specification:
- a config module written outside harness/ is linted, run through the CLI and through pytest,
  and its verdict comes from the registry: which model, which init, which masking, which
  parallel degrees are inferred from the config, never typed;
- a config with a wrong rope theta fails the lint before any rank starts, naming the field,
  both values and the file they came from;
- ``--compare`` runs two configs on the same data and seed: native Qwen3 with flex attention
  and the transformers backend with its per-document mask workaround have equal step-1 losses;
- a config of a shape the harness does not know is a full-size subject, and every check reads
  its own config.json and assets: its step-1 loss is held to the backend's rule on its own
  width and vocabulary, its saved checkpoint reloads against its own config.json;
- where a known issue makes a tied output layer's init predict each position's own input token
  (native Qwen3 on spring-2026 main, the transformers backend on both generations), a tied
  config of another shape is held to the forward of its own step-0 weights alone, and the
  verdict names the issue.
"""

import json
import shutil
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from harness.checks import reference_forward
from harness.checks.run_checks import RUN_CHECKS
from harness.cli import commands as cli
from harness.launch.run import RunSpec
from harness.launch.subjects import Subject, infer, lint
from harness.registry import paths
from harness.registry.expectations import EXPECTATIONS_FILE, ExpectationRegistry
from harness.registry.tolerances import initial_weights_forward_band, parity_tolerance
from harness.upstream.titan_api import generation

USER_MODULE = "my_qwen3"
USER_CONFIG = textwrap.dedent('''
    """A user's config file, as the source's walkthrough has them write one."""
    import dataclasses

    from harness.backends import hf_v5, titan_native

    FIXTURE = {fixture!r}


    def from_hf_weights(config):
        config.checkpoint.enable = True
        config.checkpoint.initial_load_in_hf = True
        config.checkpoint.initial_load_path = FIXTURE
        return config


    def native_tiny():
        return from_hf_weights(titan_native.tiny())  # native Qwen3, attn_backend="sdpa"


    def native_flex_tiny():
        return from_hf_weights(titan_native.tiny_flex())


    def v5_tiny():
        return from_hf_weights(hf_v5.tiny())

    def wrong_theta():
        config = native_tiny()
        for layer in config.model_spec.model.layers:
            layer.attention.rope = dataclasses.replace(layer.attention.rope, theta=1e4)
        return config
''')


OTHER_SHAPE = {"hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 2}
OTHER_CONFIG = textwrap.dedent('''
    """A user's Qwen3 of a shape the harness does not know, with assets of its own."""
    from torchtitan.trainer import Trainer

    from harness.backends.common import TINY, shared_fields
    from harness.backends.native_qwen3 import model_spec_from_hf

    ASSETS = {assets!r}


    def other_shape():
        return Trainer.Config(model_spec=model_spec_from_hf(ASSETS, flavor="other", attn_backend="sdpa"),
                              **shared_fields(TINY, hf_assets_path=ASSETS))
''')


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / f"{USER_MODULE}.py").write_text(USER_CONFIG.format(fixture=str(paths.TINY_DENSE)))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(USER_MODULE, None)


def test_what_is_checked_is_inferred_from_the_config(user_dir):
    facts = infer(Subject(USER_MODULE, "native_tiny"))
    assert (facts.kind, facts.model, facts.init, facts.mask, facts.precision) == (
        "titan_native", "tiny_dense", "pretrained", "row_causal", "float32")
    assert facts.weights_dir == paths.TINY_DENSE


def test_a_subjects_run_runs_the_parallel_degrees_its_config_sets(user_dir):
    subject = Subject(USER_MODULE, "native_tiny")
    tp2 = subject.load()
    tp2.parallelism.tensor_parallel_degree = 2
    degrees = {"native_tiny": RunSpec.for_subject(infer(subject)).parallel_degrees(2),
               "native_tp2_tiny": RunSpec.for_subject(infer(subject, tp2)).parallel_degrees(2)}
    assert degrees["native_tiny"] == {
        "data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 2, "context_parallel_degree": 1,
        "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "expert_parallel_degree": 1}
    assert degrees["native_tp2_tiny"] == {**degrees["native_tiny"], "data_parallel_shard_degree": 1,
                                          "tensor_parallel_degree": 2}


def test_the_built_in_backends_are_subjects_too():
    facts = infer(Subject.of_backend("nki_moe", "full"))
    assert (facts.kind, facts.model, facts.init) == ("nki_moe", "qwen3_30b_a3b_4l_64e_top4", "random")


def test_a_conforming_config_passes_the_lint(user_dir):
    report = lint(Subject(USER_MODULE, "native_tiny"))
    assert report.ok, report.format()


def test_a_wrong_rope_theta_fails_the_lint_naming_field_values_and_file(user_dir):
    report = lint(Subject(USER_MODULE, "wrong_theta"))
    text = "\n".join(report.violations)
    assert not report.ok
    assert "rope_theta" in text and "10000" in text and "1e+06" in text, text
    assert str(paths.TINY_DENSE / "config.json") in text, text


def test_the_cli_launches_nothing_when_the_lint_fails(user_dir, tmp_path, capsys):
    out = tmp_path / "report"
    status = cli.main(["run", "--module", USER_MODULE, "--config", "wrong_theta",
                       "--pythonpath", str(user_dir), "--output-dir", str(out)])
    assert status == 1
    assert "nothing launched" in capsys.readouterr().out
    assert not out.exists()


def test_a_bad_subject_is_refused_with_the_fix(user_dir, capsys):
    assert cli.main(["lint", "--subject", f"{USER_MODULE}:no_such_config"]) == 1
    assert "defines ['from_hf_weights', 'native_flex_tiny', 'native_tiny', 'v5_tiny', " \
        "'wrong_theta']" in capsys.readouterr().out
    assert cli.main(["lint", "--subject", "no_colon"]) == 2
    assert "is not MODULE:CONFIG" in capsys.readouterr().err


@pytest.mark.slow
def test_the_cli_runs_a_user_config_with_the_registrys_verdict(user_dir, tmp_path):
    out = tmp_path / "report"
    status = cli.main(["run", "--module", USER_MODULE, "--config", "native_tiny", "--steps", "2",
                       "--pythonpath", str(user_dir), "--output-dir", str(out)])
    results = json.loads((out / "results.json").read_text())
    run = results["runs"][0]
    assert status == 0, json.dumps(run["checks"], indent=1)
    step_1 = run["checks"]["first_step_loss"]
    assert step_1["status"] == "pass" and "recorded_losses.json" in step_1["how"]


@pytest.mark.slow
def test_pytest_runs_a_user_config_through_the_run_template(user_dir):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e/test_runs.py",
         "--subject", f"{USER_MODULE}:native_tiny", "--subject-path", str(user_dir),
         "--steps", "2", "-k", USER_MODULE],
        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # Every check of a launched run, one test each, all passing for the user's config.
    assert f"{len(RUN_CHECKS)} passed" in done.stdout, done.stdout[-2000:]


@pytest.mark.slow
def test_compare_native_flex_and_the_transformers_backend_with_its_workaround(user_dir, tmp_path):
    out = tmp_path / "report"
    status = cli.main(["run", "--compare", f"{USER_MODULE}:native_flex_tiny", f"{USER_MODULE}:v5_tiny",
                       "--workaround", "hf_block_causal", "--steps", "2", "--pythonpath",
                       str(user_dir), "--output-dir", str(out)])
    text = (out / "compare.txt").read_text()
    assert status == 0, text
    runs = json.loads((out / "results.json").read_text())["runs"]
    native, hf = (r["steps"][0]["loss"] for r in runs)
    assert abs(native - hf) <= parity_tolerance("torchrun_loss", "float32").atol, text
    assert "no step differs" in text, text


SPRING_TIED_INIT = "spring2026-titan-tied-output-init-dim-scale"


def _other_shape_assets(folder, **overrides):
    """A Qwen3 config.json (and tokenizer) of a shape the harness does not know, in ``folder``."""
    folder.mkdir()
    config = {**json.loads((paths.TINY_DENSE / "config.json").read_text()), **OTHER_SHAPE, **overrides}
    config["layer_types"] = ["full_attention"] * OTHER_SHAPE["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(paths.TINY_DENSE / name, folder / name)
    return folder


def test_a_config_of_a_shape_the_harness_does_not_know_is_checked_against_its_own_assets(
        tmp_path, monkeypatch):
    assets = _other_shape_assets(tmp_path / "assets")
    (tmp_path / "other_qwen3.py").write_text(OTHER_CONFIG.format(assets=str(assets)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "other_qwen3", raising=False)
    facts = infer(Subject("other_qwen3", "other_shape"))
    assert (facts.size, facts.model_dir) == ("full", assets), facts

    out = tmp_path / "report"
    status = cli.main(["run", "--subject", "other_qwen3:other_shape", "--steps", "2",
                       "--pythonpath", str(tmp_path), "--output-dir", str(out)])
    checks = json.loads((out / "results.json").read_text())["runs"][0]["checks"]
    assert status == 0, json.dumps(checks, indent=1)
    step_1, reload = checks["first_step_loss"], checks["hf_checkpoint_complete"]
    assert step_1["status"] == "pass" and "dumped step-0 weights" in step_1["how"], step_1
    if generation() == "spring2026":
        # tied (tiny_dense's config): held to its step-0 weights' forward alone, and says why
        assert "not held" in step_1["how"] and SPRING_TIED_INIT in step_1["how"], step_1
    else:
        assert "hidden=64" in step_1["how"], step_1
    assert reload["status"] == "pass" and str(assets / "config.json") in reload["how"], reload


# (backend, generation, tied, the known issue under which ln V + s^2/2 is not the config's
# random-init loss: None where the analytic rule holds)
UNLESS_TIED = [("titan_native", "spring2026", True, SPRING_TIED_INIT),
               ("titan_native", "spring2026", False, None),
               ("titan_native", "v0_3", True, None),  # 0.3.0's tied output: N(0, 0.02)
               ("hf_v5", "v0_3", True, "hf_v5-tied-embedding-init-scale"),
               ("hf_v5", "spring2026", True, "hf_v5-tied-embedding-init-scale"),
               ("hf_v5", "v0_3", False, None)]


@pytest.mark.parametrize(("backend", "generation_", "tied", "issue"), UNLESS_TIED)
def test_a_tied_config_of_another_shape_is_held_to_its_step0_forward_where_the_analytic_loss_fails(
        backend, generation_, tied, issue, tmp_path, monkeypatch):
    """Where a known issue makes a tied output layer's init predict each position's own input
    token, ln V + s^2/2 is not the loss of a config the harness does not know: the run is held
    to the forward of its own step-0 weights alone, and the expectation names the issue."""
    assets = _other_shape_assets(tmp_path / "assets", tie_word_embeddings=tied)
    band = initial_weights_forward_band("float32", "cpu")
    monkeypatch.setattr(reference_forward, "initial_weights_forward",
                        lambda run: (9.07, "the step-0 weights' forward (a stub)", band))
    spec = SimpleNamespace(name="other", backend=backend, model="assets", init="random",
                           mask="causal", size="full", model_dir=lambda: assets)
    run = SimpleNamespace(spec=spec, device="cpu", nproc=2, run_dir=tmp_path,
                          versions={"torchtitan-generation": generation_})
    expectation = reference_forward.expectation_for_run(run)
    assert (expectation.value, expectation.tolerance) == (9.07, band.value), expectation
    if issue is None:
        assert expectation.init is not None and "hidden=64" in expectation.init.source, expectation
    else:
        assert expectation.init is None and issue in expectation.source, expectation


def test_a_tied_run_without_a_dump_keeps_the_analytic_value_and_names_the_issue(tmp_path, monkeypatch):
    """A run that dumped no step-0 weights (neuron, over MAX_PARAMS) keeps ln V + s^2/2, as
    such runs do, and says the known issue may move it."""
    assets = _other_shape_assets(tmp_path / "assets", tie_word_embeddings=True)
    monkeypatch.setattr(reference_forward, "initial_weights_forward", lambda run: None)
    spec = SimpleNamespace(name="other", backend="titan_native", model="assets", init="random",
                           mask="causal", size="full", model_dir=lambda: assets)
    run = SimpleNamespace(spec=spec, device="neuron", nproc=2, run_dir=tmp_path,
                          versions={"torchtitan-generation": "spring2026"})
    expectation = reference_forward.expectation_for_run(run)
    assert expectation.init is None and "hidden=64" in expectation.source, expectation
    assert "may not hold" in expectation.source and SPRING_TIED_INIT in expectation.source, expectation


def test_an_unless_tied_that_names_no_known_issue_is_refused(tmp_path):
    text = EXPECTATIONS_FILE.read_text().replace(
        f'unless_tied = "{SPRING_TIED_INIT}"', 'unless_tied = "no-such-issue"')
    assert "no-such-issue" in text
    (tmp_path / "expectations.toml").write_text(text)
    with pytest.raises(ValueError, match="unless_tied = 'no-such-issue' is not a known issue"):
        ExpectationRegistry(tmp_path / "expectations.toml").rule(
            "titan_native", "assets", "random", "cpu", "causal", 2, "spring2026", own_config=True)

"""The CLI listing, failure diagnostics with replay, and the xdist NeuronCore pinning."""

from __future__ import annotations

import pytest
import torch

from harness import plants
from harness.kernels.checks import cli, runner
from harness.kernels.checks.adapters import nkilib
from harness.kernels.checks.neuron_env import neuron_kernel_env, neuron_test_env
from harness.kernels.checks.registry import OPS
from harness.kernels.checks.runner import run
from harness.kernels.checks.spec import device_status
from harness.kernels.checks.xdist import visible_cores_for_worker


def test_list_names_every_op_and_says_why_skipped():
    text = cli.list_implementations(run_them=False)
    for op in OPS:
        assert f"{op}:" in text
    assert "can run" in text
    for device in ("cuda", "neuron"):  # whatever this machine has, the listing says why
        ok, reason = device_status(device)
        assert ok or reason in text, f"{device} is unavailable ({reason}) but the listing does not say so"
    assert cli.main(["list"]) == 0


def test_failure_report_and_replay_reproduce_the_failure(tmp_path, capsys):
    defect = plants.plant("swiglu_w1_w3_swapped").kernel
    op = OPS[defect.op]
    case_name, dtype = defect.catch_on[0]
    result = run(op, defect.implementation, "cpu", op.case(case_name), dtype, save_dir=tmp_path)
    report = result.report()
    for needle in ("worst at", "rel err", "mismatched", "histogram", "float64 arbitration",
                   "replay: python -m harness.kernels.checks replay"):
        assert needle in report
    assert result.replay_path.parent == tmp_path
    bundle = torch.load(result.replay_path, weights_only=False)
    assert bundle["impl"] == defect.implementation.name
    assert set(bundle["master_inputs"]) == {"x", "num_tokens_per_expert", "w1", "w2", "w3"}
    again = runner.replay(result.replay_path, impl=defect.implementation)
    assert not again.passed and {c.name for c in again.failures} == {c.name for c in result.failures}


def test_replay_of_a_registry_implementation_via_the_cli(tmp_path, capsys):
    op = OPS["rms_norm"]
    defect = plants.plant("rmsnorm_eps_outside_sqrt").kernel
    case_name, dtype = defect.catch_on[0]
    result = run(op, defect.implementation, "cpu", op.case(case_name), dtype, save_dir=tmp_path)
    bundle = torch.load(result.replay_path, weights_only=False)
    bundle["impl"] = "transformers"  # a registered implementation replays from the file alone
    torch.save(bundle, result.replay_path)
    assert cli.main(["replay", str(result.replay_path)]) == 0
    assert "rms_norm / transformers" in capsys.readouterr().out


def test_visible_cores_follow_the_xdist_worker_id():
    assert visible_cores_for_worker("gw0") == "0"
    assert visible_cores_for_worker("gw3") == "3"
    assert visible_cores_for_worker("gw1", cores_per_worker=4) == "4-7"
    assert visible_cores_for_worker(None) is None and visible_cores_for_worker("master") is None


# ------------------------------------------------------------------ Neuron-only paths, CPU twins


def test_neuron_kernel_env_is_the_ranks_lnc():
    assert neuron_kernel_env({}) == {"NEURON_LOGICAL_NC_CONFIG": "2"}  # harness.device.devices' rank default
    assert neuron_kernel_env({"NEURON_LOGICAL_NC_CONFIG": "1"}) == {"NEURON_LOGICAL_NC_CONFIG": "1"}


def test_neuron_marked_tests_get_the_ranks_lnc_and_their_cores():
    """What tests/kernels/conftest.py sets for tests marked ``neuron`` (computed, not run on Neuron)."""
    assert neuron_test_env({}) == {"NEURON_LOGICAL_NC_CONFIG": "2"}
    assert neuron_test_env({"PYTEST_XDIST_WORKER": "gw3"}) == {"NEURON_RT_VISIBLE_CORES": "3",
                                                               "NEURON_LOGICAL_NC_CONFIG": "2"}
    assert neuron_test_env({"PYTEST_XDIST_WORKER": "gw1", "NEURON_RT_VISIBLE_CORES": "9",
                            "NEURON_LOGICAL_NC_CONFIG": "1"}) == {"NEURON_LOGICAL_NC_CONFIG": "1"}


def test_nkilib_cross_entropy_tries_the_documented_path_first():
    tried = []

    def importer(available):
        def import_module(name):
            tried.append(name)
            if name not in available:
                raise ModuleNotFoundError(f"No module named {name!r}")
            return name

        return import_module

    assert nkilib.cross_entropy_module(importer({"nkilib.experimental.loss.cross_entropy"}))[1] == (
        "nkilib.experimental.loss.cross_entropy")
    module, found, missed = nkilib.cross_entropy_module(importer({"nkilib.core.loss.cross_entropy"}))
    assert found == "nkilib.core.loss.cross_entropy" and "nkilib.experimental.loss.cross_entropy" in missed[0]
    assert tried[0] == tried[1] == "nkilib.experimental.loss.cross_entropy"
    with pytest.raises(ImportError, match="tried nkilib.experimental.loss.cross_entropy.*nkilib.core.loss"):
        nkilib.cross_entropy_module(importer(set()))


def test_bench_reports_first_call_separately_from_steady_state():
    ticks = iter([0.0, 5.0, 10.0, 10.5, 20.0, 20.25, 30.0, 30.5])  # first call 5 s, then 0.5, 0.25, 0.5

    op = OPS["rms_norm"]
    bench = cli.benchmark(op, op.implementation("torchtitan"), "cpu", op.case("single_token"), torch.float32,
                          iters=3, clock=lambda: next(ticks))
    assert bench["first_call_s"] == 5.0 and bench["median_s"] == 0.5 and bench["min_s"] == 0.25
    assert "first call 5000.000 ms (includes compile)" in cli.format_benchmark(bench)

"""The CLI listing, failure diagnostics with replay, and the xdist NeuronCore pinning."""

from __future__ import annotations

import torch

from harness.kernels import cli, diagnostics
from harness.kernels.defects import DEFECTS
from harness.kernels.registry import OPS
from harness.kernels.runner import run
from harness.kernels.xdist import visible_cores_for_worker


def test_list_names_every_op_and_says_why_skipped():
    text = cli.list_implementations(run_them=False)
    for op in OPS:
        assert f"{op}:" in text
    assert "can run" in text
    assert "skipped: no Neuron hardware" in text and "skipped: no CUDA device" in text
    assert cli.main(["list"]) == 0


def test_failure_report_and_replay_reproduce_the_failure(tmp_path, capsys):
    defect = next(d for d in DEFECTS if d.name == "swiglu_w1_w3_swapped")
    op = OPS[defect.op]
    case_name, dtype = defect.catch_on[0]
    result = run(op, defect.impl, "cpu", op.case(case_name), dtype, save_dir=tmp_path)
    report = result.report()
    for needle in ("worst at", "rel err", "mismatched", "histogram", "float64 arbitration", "replay: python -m harness.kernels replay"):
        assert needle in report
    assert result.replay_path.parent == tmp_path
    bundle = torch.load(result.replay_path, weights_only=False)
    assert bundle["impl"] == defect.impl.name and set(bundle["master_inputs"]) == {"x", "num_tokens_per_expert", "w1", "w2", "w3"}
    again = diagnostics.replay(result.replay_path, impl=defect.impl)
    assert not again.passed and {c.name for c in again.failures} == {c.name for c in result.failures}


def test_replay_of_a_registry_implementation_via_the_cli(tmp_path, capsys):
    op = OPS["rms_norm"]
    defect = next(d for d in DEFECTS if d.op == "rms_norm")
    result = run(op, defect.impl, "cpu", op.case(defect.catch_on[0][0]), defect.catch_on[0][1], save_dir=tmp_path)
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

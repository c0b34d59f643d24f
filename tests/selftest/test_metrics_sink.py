"""The JSONL sink keeps full precision and stops at the first non-finite loss."""

import json

import pytest

from harness.results.run_result import read_step_records
from harness.upstream.metrics_sink import LOSS_KEY, JsonlLogger, NonFiniteLossError

METRICS = {"grad_norm": 1.0, "throughput(tps)": 10.0, "time_metrics/end_to_end(s)": 0.5,
           "memory/max_reserved(GiB)": 1.0, "lr": 1e-3}


def test_records_round_trip_at_full_precision(tmp_path):
    sink = JsonlLogger(str(tmp_path / "rank0.jsonl"), stop_on_nonfinite_loss=True)
    sink.log({LOSS_KEY: 1.2345678901234567, **METRICS}, step=1)
    sink.close()
    (record,) = read_step_records(tmp_path / "rank0.jsonl")
    assert record.loss == 1.2345678901234567 and record.step == 1


def test_nonfinite_loss_is_written_then_stops_the_run(tmp_path):
    path = tmp_path / "rank0.jsonl"
    sink = JsonlLogger(str(path), stop_on_nonfinite_loss=True)
    with pytest.raises(NonFiniteLossError, match="non-finite loss nan at step 3"):
        sink.log({LOSS_KEY: float("nan"), **METRICS}, step=3)
    assert json.loads(path.read_text())["step"] == 3

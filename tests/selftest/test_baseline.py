"""Tonight against a baseline report (harness/report/baseline.py), on results.json documents.

Specification:
- every run is compared with the same run of the baseline (a self-test's ``+plant:`` suffix
  aside): the step-1 loss exactly, the loss and grad-norm curves (their first divergent
  step), compile time, step time and peak memory as ratios against the thresholds of
  harness/registry/tolerances.py;
- two identical reports flag nothing; a run missing from either side is flagged;
- a numeric change with the same commit and package versions is flagged as such;
- the first divergent module of tonight's diagnosed run is named beside the flags;
- compile time is compared only between runs whose compile cache was in the same state (a
  cold-cache night against a warm one is said, not flagged); step time still is;
- a path that holds no results.json is refused, naming what to pass.
"""

from __future__ import annotations

import copy
import json

import pytest

from harness.launch.run import cache_entries, compile_cache_state
from harness.registry.tolerances import BASELINE_THRESHOLDS
from harness.report import baseline

HEADER = {"commit": "abc123", "version torch": "2.14.0", "version torchtitan": "0.3.0"}


def report(losses, grad_norms=None, step_time=0.3, first_step_time=1.2, memory=0.93,
           name="titan_native-tiny-pretrained", header=HEADER, diagnosis=None, cache=None):
    steps = [{"step": i + 1, "loss": loss, "grad_norm": (grad_norms or [1.0] * len(losses))[i],
              "step_time_s": first_step_time if i == 0 else step_time,
              "peak_memory_gib": memory, "tokens_per_s": 1000.0} for i, loss in enumerate(losses)]
    checks = {"first_step_loss": {"status": "fail", "observed": {"diagnosis": diagnosis}}} \
        if diagnosis else {}
    compile_cache = {"state": cache, "new_entries": 12 if cache == "cold" else 0} if cache else None
    return {"header": dict(header), "runs": [{"name": name, "steps": steps, "checks": checks,
                                              "compile_cache": compile_cache}]}


CLEAN = [1.2743813991546631, 1.25, 1.24, 1.23]


def test_two_identical_reports_flag_nothing():
    result = baseline.compare(report(CLEAN), report(CLEAN))
    assert result.ok and not result.flagged, result.lines()
    assert result.lines()[-1] == "nothing flagged"


def test_a_changed_step_one_loss_is_flagged_exactly():
    tonight = report([CLEAN[0] + 1e-7, *CLEAN[1:]])
    flags = baseline.compare(tonight, report(CLEAN)).runs["titan_native-tiny-pretrained"].flags
    assert [(f.what, f.step) for f in flags][:1] == [("step-1 loss", 1)]


def test_the_first_divergent_step_of_each_curve_is_named():
    tonight = report(CLEAN[:2] + [CLEAN[2] + 1e-6, CLEAN[3]], grad_norms=[1, 1, 1, 2.0])
    flags = baseline.compare(tonight, report(CLEAN)).runs["titan_native-tiny-pretrained"].flags
    assert [(f.what, f.step) for f in flags] == [("loss curve", 3), ("grad-norm curve", 4)]


@pytest.mark.parametrize("what,field", [("step_time", "step_time"),
                                         ("compile_time", "first_step_time"),
                                         ("peak_memory", "memory")])
def test_time_and_memory_are_flagged_only_beyond_their_ratio(what, field):
    base = {"step_time": 0.3, "first_step_time": 1.2, "memory": 0.93}
    limit = BASELINE_THRESHOLDS[what].max_ratio
    within = baseline.compare(report(CLEAN, **{field: base[field] * limit * 0.99}), report(CLEAN))
    beyond = baseline.compare(report(CLEAN, **{field: base[field] * limit * 1.01}), report(CLEAN))
    assert within.ok, within.lines()
    assert [f.what for f in beyond.flagged[0].flags] == [what.replace("_", " ")]


def test_a_numeric_change_without_a_code_or_version_change_is_flagged_as_such():
    changed = report([CLEAN[0] + 1e-3, *CLEAN[1:]])
    silent = baseline.compare(changed, report(CLEAN))
    assert silent.silent_change
    assert any("NO CODE OR VERSION CHANGE" in line for line in silent.lines())
    upgraded = baseline.compare(report([CLEAN[0] + 1e-3, *CLEAN[1:]],
                                       header={**HEADER, "version torch": "2.14.1"}), report(CLEAN))
    assert not upgraded.silent_change and upgraded.header_changes == ["version torch: 2.14.0 -> 2.14.1"]


def test_a_planted_run_is_matched_to_the_clean_run_and_its_module_named():
    diagnosis = {"module": "layers.1.attention.q_norm"}
    tonight = report([CLEAN[0] + 7.7e-4, *CLEAN[1:]], diagnosis=diagnosis,
                     name="titan_native-tiny-pretrained+plant:qk_norm_swap_layer1")
    result = baseline.compare(tonight, report(CLEAN))
    (flagged,) = result.flagged
    assert flagged.name == "titan_native-tiny-pretrained+plant:qk_norm_swap_layer1"
    assert flagged.flags[0].step == 1 and flagged.module == "layers.1.attention.q_norm"
    assert "first divergent module layers.1.attention.q_norm" in "\n".join(result.lines())


def test_runs_missing_on_either_side_are_flagged():
    base = report(CLEAN)
    base["runs"].append(copy.deepcopy(base["runs"][0]) | {"name": "nki_moe-tiny-pretrained"})
    result = baseline.compare(report(CLEAN, name="hf_v5-tiny-pretrained"), base)
    assert not result.ok
    assert result.missing == ["nki_moe-tiny-pretrained", "titan_native-tiny-pretrained"]
    assert result.flagged[0].flags[0].detail == "not in the baseline"


def test_a_baseline_path_without_results_json_is_refused(tmp_path):
    with pytest.raises(baseline.BaselineError, match="no results.json"):
        baseline.load(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"something": 1}))
    with pytest.raises(baseline.BaselineError, match="not a harness results.json"):
        baseline.load(tmp_path)


def test_a_cold_compile_cache_against_a_warm_baseline_is_no_compile_time_regression():
    slow_first = BASELINE_THRESHOLDS["compile_time"].max_ratio * 1.2 * 2
    tonight = report(CLEAN, first_step_time=slow_first, cache="cold", step_time=0.3)
    result = baseline.compare(tonight, report(CLEAN, first_step_time=2.0, cache="warm"))
    run = result.runs["titan_native-tiny-pretrained"]
    assert result.ok and "compile_time" not in run.ratios, result.lines()
    assert any("compile time not compared: tonight's compile cache was cold (12 new cache entries), "
               "the baseline's warm (0 new cache entries)" in line for line in result.lines())


def test_compile_time_is_compared_between_nights_whose_cache_was_alike():
    slow_first = BASELINE_THRESHOLDS["compile_time"].max_ratio * 1.2 * 2
    for state in ("warm", "cold"):
        tonight = report(CLEAN, first_step_time=slow_first, cache=state)
        flags = baseline.compare(tonight, report(CLEAN, first_step_time=2.0, cache=state)).flagged
        assert [f.what for c in flags for f in c.flags] == ["compile time"], state


def test_a_cold_night_still_has_its_step_time_compared():
    slow = BASELINE_THRESHOLDS["step_time"].max_ratio * 1.2 * 0.3
    tonight = report(CLEAN, step_time=slow, cache="cold")
    flags = baseline.compare(tonight, report(CLEAN, cache="warm")).flagged
    assert [f.what for c in flags for f in c.flags] == ["step time"]


def test_a_launch_records_whether_it_found_its_compile_cache_warm(tmp_path):
    cache = tmp_path / "neff"
    (cache / "MODULE_1").mkdir(parents=True)
    (cache / "MODULE_1" / "graph.neff").write_bytes(b"x")
    before = cache_entries(str(cache))
    assert compile_cache_state(str(cache), before)["state"] == "warm"
    (cache / "MODULE_2").mkdir()
    (cache / "MODULE_2" / "graph.neff").write_bytes(b"y")
    assert compile_cache_state(str(cache), before) == {
        "dir": str(cache), "entries_before": 1, "new_entries": 1, "state": "cold"}
    assert compile_cache_state(None, cache_entries(None)) is None  # a device with no cache

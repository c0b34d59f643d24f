"""The device-band policy (harness/registry/tolerances.py): a comparison never measured on the
device it runs on is held there to a coarse bound that still catches the defects the harness
knows; a measured device band replaces it; the report says which kind each check ran on.

Specification:
- every coarse bound lies between the CPU band and a third of the smallest known defect's
  effect on that quantity: a defect the CPU band catches, the coarse bound catches too (shown
  here on the defect's delta), and the CPU's measured numerics pass it;
- on CPU every band is the measured one; on neuron, until recorded, every comparison with a
  coarse entry is coarse, and one with none is refused by name;
- ``scripts/record_bands.py --device neuron`` turns a night's report (its equivalence section)
  into measured bands in fixtures/device_bands.toml, 10x the night's worst delta, and refuses a
  band that would be coarser than the coarse bound (it could no longer catch the defects).
The planted runs that show the coarse bounds catching real defects on the CPU tier are in
tests/parity/test_layouts.py (doubled expert gradients under EP, a TP partial sum left
unreduced: each held to device="neuron" too).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tomllib

import pytest

from harness.registry import paths
from harness.registry import tolerances as T


def test_each_coarse_bound_catches_its_defect_and_passes_the_cpus_numerics():
    for quantity, effect in T.DEFECT_EFFECTS.items():
        for (q, regime, device), cpu in list(T._PARITY.items()):
            if q != quantity or device != "cpu":
                continue
            coarse = T.parity_tolerance(quantity, regime, "neuron")
            assert coarse.kind == "coarse"
            bound = coarse.atol or coarse.rtol
            # the CPU band passes the coarse bound; a defect the CPU band catches fails it too
            assert (cpu.atol or cpu.rtol) <= bound, (quantity, regime)
            if effect.effect > (cpu.atol or cpu.rtol):
                assert not effect.effect <= bound, (quantity, regime, bound, effect.effect)
                assert bound <= effect.effect * T.COARSE_FRACTION + 1e-15


def test_bands_are_measured_on_cpu_and_coarse_on_an_unmeasured_device():
    assert T.band_kind("layout_loss", "float32", "cpu") == "measured"
    assert T.band_kind("layout_loss", "float32", "neuron") == "coarse"
    assert "record_bands.py --device neuron" in T.parity_tolerance("layout_loss", "float32", "neuron").why
    with pytest.raises(KeyError, match="not measured"):
        T.parity_tolerance("router_flips", "bf16_experts", "neuron")  # no coarse entry: refused


def _record_bands():
    spec = importlib.util.spec_from_file_location("record_bands", paths.REPO_ROOT / "scripts" / "record_bands.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _report(tmp_path, delta: float):
    report = {"runs": [{"name": "titan_native-tiny-pretrained@compile", "device": "neuron"},
                       {"name": "titan_native-tiny-pretrained", "device": "neuron"}],
              "header": {"date": "2027-01-01"},
              "equivalence": [{"kind": "layout", "run": "titan_native-tiny-pretrained@compile",
                               "reference": "titan_native-tiny-pretrained", "status": "agree",
                               "tolerance": "layout_loss float32 (coarse on neuron)",
                               "band": 3.3e-3, "max_delta": delta, "steps": 10}]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(report))
    return path


def test_a_nights_report_becomes_measured_bands(tmp_path, monkeypatch):
    record = _record_bands()
    out = tmp_path / "device_bands.toml"
    assert record.main(["--device", "neuron", "--report", str(_report(tmp_path, 4e-5)),
                        "--output", str(out)]) == 0
    entry = tomllib.loads(out.read_text())["neuron"]["layout_loss/float32"]
    assert entry["atol"] == pytest.approx(4e-4) and "4e-05" in entry["why"]
    # a night whose worst delta x 10 would pass the defects is refused, naming the quantity
    assert record.main(["--device", "neuron", "--report", str(_report(tmp_path, 5e-4)),
                        "--output", str(tmp_path / "refused.toml")]) == 1
    assert not (tmp_path / "refused.toml").exists()

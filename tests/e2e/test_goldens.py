"""The multi-step goldens: committed 100-step loss curves of the tiny dense and MoE runs, per
torchtitan generation and device (tests/assets/losses/<generation>/<device>/<run>.txt, written by
scripts/record_goldens.py; harness/results/goldens.py, harness/launch/goldens.py).

Specification:
- every committed golden is torchtitan's loss-file format (``<step> <loss>``, steps 1..N, each loss
  finite and written so it reads back as the same float) with a sidecar saying what makes it
  reproducible (torch, torchtitan, the arithmetic identity: harness/device/arithmetic.py) and how
  to regenerate it; both runs have one on cpu for both generations CI runs;
- a 100-step run equals its golden bit for bit where torch, torchtitan and the arithmetic are the
  golden's; where only the arithmetic differs, within the policy's ``golden_curve_across_machines``
  where one was measured (the dense float32 run), else it is not compared and says what differs
  (slow tier: two launches of 100 steps);
- a golden recorded on another machine or stack is never compared bit for bit and never fails
  where no band was measured: it is reported (what differs, how to re-record);
- the comparison fails on a curve that drifts by one float32 ulp from step 51 on (plant
  ``golden_curve_drifts``), naming the first divergent step and printing the new curve; within
  the across-machines band, on one that drifts by 100 ulps;
- the default tier's cheap form, with no launch of its own: the run template's pretrained runs
  share the golden runs' first losses up to the first step whose learning rate depends on the
  run's length, and equal them there under the same rule.
"""


import pytest

from harness import plants
from harness.backends import BACKENDS
from harness.device.devices import runs_on
from harness.launch.goldens import (
    CPU_GOLDEN_GENERATIONS,
    GOLDEN_BACKENDS,
    GOLDEN_STEPS,
    RECORD_COMMAND,
    GoldenCase,
    golden_cases,
    here,
)
from harness.launch.run_matrix import RunCase
from harness.registry import paths
from harness.registry.tolerances import parity_tolerance
from harness.results import goldens
from harness.upstream.titan_api import generation

COMPARED_DEVICES = ("cpu", "cuda")  # neuron: docs/expectations.md "Multi-step goldens"
TIER_MARKS = {"cuda": (pytest.mark.cuda,)}


def _cases():
    return [pytest.param(c, id=c.id, marks=TIER_MARKS.get(c.device, ()))
            for c in golden_cases(COMPARED_DEVICES)]


def _golden(case: GoldenCase) -> goldens.Golden:
    path = goldens.loss_file(generation(), runs_on(case.device), case.spec.name)
    if not path.is_file():
        pytest.skip(f"no golden {path.relative_to(paths.REPO_ROOT)} for torchtitan {generation()} "
                    f"on {runs_on(case.device)}; record it with: "
                    + RECORD_COMMAND.format(device=runs_on(case.device)))
    return goldens.read(path)


def _rule(case: GoldenCase, golden: goldens.Golden) -> goldens.Policy:
    device = runs_on(case.device)
    rule = goldens.policy(golden, here(device), case.regime, device)
    if rule.band is None:
        pytest.skip(rule.why)
    return rule


def committed() -> list:
    return sorted(paths.GOLDENS.glob("*/*/*.txt"))


# ------------------------------------------------------------------------ the committed files
def test_every_committed_golden_is_a_torchtitan_loss_file_with_its_sidecar():
    assert committed(), f"no goldens under {paths.GOLDENS}"
    for path in committed():
        golden = goldens.read(path)  # steps 1..N, finite, sidecar complete and naming this file
        side = golden.sidecar
        assert (side["generation"], side["device"]) == (path.parent.parent.name, path.parent.name), path
        assert path.read_text() == goldens.format_losses(golden.losses), f"{path}: not as written"
        assert side["steps"] == GOLDEN_STEPS == len(side["lr"]), path


def test_both_ci_generations_have_the_goldens_of_their_cpu_runs():
    for gen in CPU_GOLDEN_GENERATIONS:
        for case in golden_cases(("cpu",)):
            golden = goldens.read(case.path(gen))
            assert golden.run == case.spec.name
            # a name of its own: never paired with the template's run of the same backend
            assert golden.run != RunCase("cpu", case.backend, "tiny", "pretrained",
                                         BACKENDS[case.backend].default_attention).run_spec(10).name


def test_the_loss_file_parser_refuses_what_is_not_a_loss_curve():
    for text, said in (("1 1.5\n3 1.4\n", "step 3 where step 2"), ("1 nan\n", "not finite"),
                       ("1 1.5 2.0\n", "expected '<step> <loss>'"), ("", "no steps")):
        with pytest.raises(goldens.GoldenError, match=said):
            goldens.parse_losses(text)


# ------------------------------------------------------------- which rule holds, and where
def test_a_golden_of_another_machine_or_stack_is_reported_not_failed():
    golden = goldens.read(golden_cases(("cpu",))[0].path(generation()))
    recorded = golden.reproducible_by
    assert goldens.policy(golden, dict(recorded), "float32", "cpu").band == 0.0
    elsewhere = {**recorded, "arithmetic": {"cpu vendor": "GenuineIntel", "torch cpu capability": "AVX2"}}
    rule = goldens.policy(golden, elsewhere, "float32", "cpu")
    assert rule.band == parity_tolerance("golden_curve_across_machines", "float32", "cpu").atol
    assert "arithmetic: GenuineIntel, torch cpu capability AVX2 here" in rule.why
    moe = goldens.read(GoldenCase("nki_moe", "cpu").path(generation()))
    rule = goldens.policy(moe, {**moe.reproducible_by, "arithmetic": elsewhere["arithmetic"]},
                          "bf16_experts", "cpu")
    assert rule.band is None, "the MoE curve held to a band no measurement justifies"
    assert "arithmetic: GenuineIntel, torch cpu capability AVX2 here" in rule.why
    newer = {**recorded, "torch": "9.9.9"}
    rule = goldens.policy(golden, newer, "float32", "cpu")
    assert rule.band is None, "another torch's curve compared"
    assert f"torch: 9.9.9 here, {recorded['torch']} in the golden" in rule.why
    assert RECORD_COMMAND.format(device="cpu") in rule.why


def test_the_curve_comparison_fails_on_a_drifted_curve():
    golden = goldens.read(golden_cases(("cpu",))[0].path(generation()))
    assert goldens.compare(golden.run, golden.losses, golden.losses).ok
    drifted = plants.make("golden_curve_drifts", golden.losses)
    comparison = goldens.compare(golden.run, drifted, golden.losses)
    assert not comparison.ok and comparison.first_step == 51
    assert "first divergent step 51" in comparison.message()
    assert goldens.format_losses(drifted) in comparison.message()  # ready to paste
    band = parity_tolerance("golden_curve_across_machines", "float32", "cpu").atol
    assert goldens.compare(golden.run, drifted, golden.losses, band).ok  # one ulp: within it
    crept = plants.make("golden_curve_drifts", golden.losses, ulps=100)  # ~1.2e-5 at loss ~1.2
    comparison = goldens.compare(golden.run, crept, golden.losses, band)
    assert not comparison.ok and comparison.first_step == 51, comparison.message()
    short = goldens.compare(golden.run, golden.losses[:99], golden.losses)
    assert not short.ok and short.first_step == 100


# ---------------------------------------------------------------- launched: default tier
def _template_comparison(backend, device_runs, steps, workarounds, drift_from=None):
    """The run template's tiny pretrained run on cpu (``--steps`` steps: no launch of its own)
    against its golden's first losses (drifted from step ``drift_from``: the plant)."""
    case = GoldenCase(backend, "cpu")
    golden = _golden(case)
    rule = _rule(case, golden)
    template = RunCase("cpu", backend, "tiny", "pretrained", BACKENDS[backend].default_attention)
    spec = template.suite_spec(steps, workarounds=workarounds)
    if spec.all_workarounds != case.spec.all_workarounds:
        pytest.skip(f"this session's {spec.name} is not its golden's run ({case.spec.name}): "
                    "not comparable")
    run = device_runs("cpu").get(spec)
    shared = goldens.shared_steps([s.lr for s in run.steps], golden.sidecar["lr"])
    assert shared >= 2, (f"{spec.name} shares {shared} learning rates with its golden: "
                         f"{[s.lr for s in run.steps][:4]} vs {golden.sidecar['lr'][:4]}")
    losses = golden.losses if drift_from is None else plants.make(
        "golden_curve_drifts", golden.losses, from_step=drift_from)
    return goldens.compare(spec.name, run.losses[:shared], losses[:shared], rule.band)


@pytest.mark.parametrize("backend", GOLDEN_BACKENDS)
def test_the_template_run_begins_on_its_golden(backend, device_runs, steps, workarounds):
    comparison = _template_comparison(backend, device_runs, steps, workarounds)
    assert comparison.ok, comparison.message()


def test_the_template_check_fails_on_a_golden_drifted_from_step_2(device_runs, steps, workarounds):
    comparison = _template_comparison("titan_native", device_runs, steps, workarounds, drift_from=2)
    assert not comparison.ok and comparison.first_step == 2, comparison.message()


# ------------------------------------------------------------------ launched: slow tier
def _curve_comparison(golden_case, device_runs, drift_from=None):
    golden = _golden(golden_case)
    rule = _rule(golden_case, golden)
    run = device_runs(runs_on(golden_case.device)).get(golden_case.spec)
    assert run.returncode == 0 and not run.timed_out, run.describe()
    losses = golden.losses if drift_from is None else plants.make(
        "golden_curve_drifts", golden.losses, from_step=drift_from)
    return goldens.compare(golden_case.spec.name, run.losses, losses, rule.band)


@pytest.mark.slow
@pytest.mark.parametrize("golden_case", _cases())
def test_the_100_step_curve_is_its_golden(golden_case, device_runs):
    comparison = _curve_comparison(golden_case, device_runs)
    assert comparison.ok, comparison.message()


@pytest.mark.slow
def test_the_100_step_check_fails_on_a_golden_drifted_from_step_51(device_runs):
    """The same launch as the dense cpu case above (one RunSpec, one launch)."""
    comparison = _curve_comparison(GoldenCase("titan_native", "cpu"), device_runs, drift_from=51)
    assert not comparison.ok and comparison.first_step == 51, comparison.message()

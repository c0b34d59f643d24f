"""The runs behind the multi-step goldens (harness/results/goldens.py): the tiny dense
(titan_native) and MoE (nki_moe) runs from the pretrained fixtures, ``GOLDEN_STEPS`` steps, on one
device, launched through the harness's own launch path.

Each is the run template's tiny pretrained run (harness/launch/run_matrix.py ``RunCase.run_spec``)
at ``GOLDEN_STEPS`` steps, without the HF save (a golden is its losses), under a name of its own
(``RunSpec.label``: ``<run>@<steps>steps``): a session report holding both it and the
template's 10-step run of the same backend, and the nightly's baseline, which pairs runs by name
(harness/report/baseline.py), must never take one for the other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from harness.backends import BACKENDS
from harness.device.arithmetic import identity
from harness.launch.run import RunSpec
from harness.launch.run_matrix import RunCase
from harness.registry import paths
from harness.results import goldens
from harness.upstream.versions import package_versions

GOLDEN_STEPS = 100
GOLDEN_BACKENDS = ("titan_native", "nki_moe")  # the tiny dense and MoE runs
GOLDEN_DEVICES = ("cpu", "cuda", "neuron")  # where the tiny sizes run
REGIMES = {"titan_native": "float32", "nki_moe": "bf16_experts"}  # the policy's regimes
# The generations CI runs on CPU: their cpu goldens are committed (tests/e2e/test_goldens.py).
CPU_GOLDEN_GENERATIONS = ("v0_3", "spring2026")
RECORD_COMMAND = "python3 scripts/record_goldens.py --device {device}"


def golden_spec(backend: str, device: str = "cpu", steps: int = GOLDEN_STEPS) -> RunSpec:
    """A golden's run, named for how many steps it runs (``<run>@<steps>steps``)."""
    case = RunCase(device, backend, "tiny", "pretrained", BACKENDS[backend].default_attention)
    return replace(case.run_spec(steps), save_hf=False, label=f"{steps}steps")


@dataclass(frozen=True)
class GoldenCase:
    """One golden: a backend's golden run on a device, and its files for a generation."""

    backend: str
    device: str

    @property
    def id(self) -> str:
        return f"{self.device}-{self.backend}"

    @property
    def spec(self) -> RunSpec:
        return golden_spec(self.backend, self.device)

    @property
    def regime(self) -> str:
        return REGIMES[self.backend]

    def path(self, generation: str, root: Path = paths.GOLDENS) -> Path:
        return goldens.loss_file(generation, self.device, self.spec.name, root)


def golden_cases(devices=GOLDEN_DEVICES) -> list[GoldenCase]:
    return [GoldenCase(b, d) for d in devices for b in GOLDEN_BACKENDS]


def here(device: str) -> dict:
    """What this machine would record as a golden's ``reproducible_by`` on ``device``."""
    versions = package_versions()
    return {"torch": versions.get("torch"), "torchtitan": versions.get("torchtitan"),
            "arithmetic": identity(device)}

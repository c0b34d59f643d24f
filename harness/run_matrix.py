"""The runs every device tier makes, generated from the backend registry and the device tiers
(``instantiate_device_type_tests`` for launched runs).

A ``RunCase`` is one (device, backend, size, attention, init). Each device runs the sizes of
its tier (harness/devices.py ``TIER_SIZES``); each backend runs every init of the size with
its default attention (the source's configuration), and its other attention variants from the
pretrained fixture at tiny size, where a recorded loss tells the masks apart (on the devices
that can run them: ``UNSUPPORTED_ATTENTION``).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.backends import BACKENDS
from harness.devices import KINDS, TIER_SIZES, UNSUPPORTED_ATTENTION
from harness import known_issues
from harness.launch import RunSpec
from harness.titan_api import generation
from harness.subjects import Subject, infer

# Full-size runs on trn2: compile on the first step plus 10 steps of the real model. Every
# neuron run at its timeout must fit the nightly test step's limit
# (.github/workflows/nightly-trn2.yml; tests/e2e/test_workflows.py checks the sum).
FULL_TIMEOUT_S = 100 * 60
TINY_TIMEOUT_S = 600


def can_save_hf(backend: str) -> bool:
    """Whether runs save an HF checkpoint: always, unless a known issue (check ``hf_save``)
    says this backend cannot here; then its other checks still run on a run without it."""
    return not known_issues.applicable("hf_save", backend=backend, generation=generation())


@dataclass(frozen=True)
class RunCase:
    device: str
    backend: str
    size: str
    init: str
    attention: str
    # A variant whose expected step-1 loss its band cannot tell from the default variant's
    # tells nothing a commit needs: it runs in the slow tier (``cases`` decides, from data).
    slow: bool = False

    @property
    def id(self) -> str:
        default = BACKENDS[self.backend].default_attention
        attention = "" if self.attention == default else f"-{self.attention}"
        return f"{self.device}-{self.backend}-{self.size}{attention}-{self.init}"

    def run_spec(self, steps: int, assets_dir: str | None = None, workarounds=()) -> RunSpec:
        full = self.size == "full"
        return RunSpec(backend=self.backend, size=self.size, init=self.init, steps=steps,
                       attention=self.attention, save_hf=can_save_hf(self.backend),
                       workarounds=tuple(workarounds),
                       hf_assets_path=assets_dir if full else None,
                       timeout_s=FULL_TIMEOUT_S if full else TINY_TIMEOUT_S)


@dataclass(frozen=True)
class SubjectCase:
    """A user's config function (``--subject M:C``) on one device: the same checks."""

    device: str
    subject: Subject
    pythonpath: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.device}-{self.subject.name}"

    def run_spec(self, steps: int, assets_dir: str | None = None, workarounds=()) -> RunSpec:
        facts = infer(self.subject)
        timeout = FULL_TIMEOUT_S if facts.size == "full" else TINY_TIMEOUT_S
        return RunSpec.for_subject(facts, steps=steps, save_hf=True, timeout_s=timeout,
                                   workarounds=tuple(workarounds), pythonpath=self.pythonpath)


def cases(devices=KINDS) -> list[RunCase]:
    out = []
    for device in devices:
        for size in TIER_SIZES[device]:
            for spec in BACKENDS.values():
                if size not in spec.sizes:
                    continue
                for attention in spec.attention:
                    if attention in UNSUPPORTED_ATTENTION.get(device, ()):
                        continue
                    for init in spec.size(size).inits:
                        default = attention == spec.default_attention
                        if default or (size == "tiny" and init == "pretrained"):
                            slow = not default and not _distinguishable(spec, size, attention)
                            out.append(RunCase(device, spec.name, size, init, attention, slow))
    return out


def _distinguishable(spec, size: str, attention: str) -> bool:
    """Whether the pretrained step-1 expectation of ``attention`` differs from the default
    variant's by more than its band (else a mask mix-up would pass the check anyway)."""
    from harness.expectations import ExpectationRegistry, MissingExpectation

    registry, model = ExpectationRegistry(), spec.size(size).model
    try:
        default, variant = (registry.get(spec.name, model, "pretrained", "cpu", spec.mask(a))
                            for a in (spec.default_attention, attention))
    except MissingExpectation:
        return True  # the run will say what is missing
    return abs(default.value - variant.value) > max(default.tolerance, variant.tolerance)

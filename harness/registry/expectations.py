"""Expected first-step losses: the registry of fixtures/expectations.toml, the one home of its
lookup (``ExpectationRegistry``) and of what it states: for a run's key, the rule it is held to
(``ExpectationRule``: a published or recorded value, read here, or how the value is computed,
with its band and provenance) and the comparison with an expected value (``Expectation``).

Like HF's ``Expectations``, values are keyed by where they apply (backend, model, init, device
kind); unlike it, there is no "closest key" fallback: a missing key is an error that names it.

This registry returns data and computes nothing: the analytic random-init loss ``ln V + s^2/2``
and its init std rules are the references' (harness/references/expected_loss.py, which turns a
rule into an ``Expectation`` where no launched run is needed), and the forwards of a launched
run's weights are the checks' (harness/checks/reference_forward.py ``expectation_for_run``).
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from harness.registry import known_issues, paths
from harness.registry.generations import api_generation_of, installed_generation
from harness.registry.hf_config import read_config_json
from harness.registry.tolerances import LossBand, loss_band

EXPECTATIONS_FILE = paths.FIXTURES / "expectations.toml"


class MissingExpectation(KeyError):
    pass


@dataclass(frozen=True)
class ExpectationRule:
    """What fixtures/expectations.toml states for a run's key: exactly one source of the value
    (``value``: a published number or a recorded loss, with ``source``; ``lm_head_std``: the
    analytic random-init loss at that init std rule; ``hf_forward``: the run's HF weights on its
    own step-1 batches), the entry's band, and whether a run that dumped its step-0 weights is
    held to their forward first (``initial_weights_forward``). ``analytic_unless_tied`` names the
    known issue under which ln V + s^2/2 is not the random-init loss of a model whose output
    layer is its embedding (harness/registry/known_issues/): such a run is held to its step-0
    weights' forward alone."""

    key: tuple[str, ...]  # the entry's (backend, model, init, device, mask, generation)
    band: LossBand
    value: float | None = None
    source: str = ""
    lm_head_std: str | None = None
    hf_forward: bool = False
    initial_weights_forward: bool = False
    analytic_unless_tied: str | None = None

    def expectation(self, value: float, source: str) -> Expectation:
        """``value`` (from ``source``) held to in this rule's band."""
        return Expectation(self.key, value, self.band.value, self.band.name, source)


@dataclass(frozen=True)
class Expectation:
    key: tuple[str, ...]  # the key of the entry it comes from
    value: float
    tolerance: float
    tolerance_name: str
    source: str  # how the value was obtained, for messages and reports
    # A random-init run held to the forward of its own step-0 weights (``value``) is also held
    # to what a random init of its configured scale gives: that forward against ln V + s^2/2,
    # in the draw band (``init``; harness/registry/tolerances.py RANDOM_INIT_DRAW).
    init: Expectation | None = None
    what: str = "first-step loss"

    def _miss(self, observed: float) -> str | None:
        if math.isfinite(observed) and abs(observed - self.value) <= self.tolerance:
            return None
        return (
            f"{self.what} {observed:.6f} vs expected {self.value:.6f} "
            f"(diff {observed - self.value:+.3g}, |diff| > {self.tolerance_name} {self.tolerance:g}); "
            f"expected value from {self.source}; key {self.key}"
        )

    def check(self, observed: float) -> str | None:
        """None when ``observed`` meets the expectation, else a message saying by how much not.
        With an ``init``: first the run against the forward of its weights, then those weights."""
        problem = self._miss(observed)
        if problem is None and self.init is not None:
            init_problem = self.init._miss(self.value)
            if init_problem is not None:
                return (f"the step-1 loss is that of the run's step-0 weights ({self.source}; "
                        f"{observed - self.value:+.3g}), but those weights are not a random init "
                        f"of the configured scale: {init_problem}")
        return problem

    def deviation(self, observed: float) -> float:
        """``observed`` minus the expected value; with an ``init`` whose forward the run meets,
        the step-0 weights' forward minus ln V + s^2/2 (what an init defect moves, the quantity
        the random-init known issues record)."""
        if self.init is not None and self._miss(observed) is None:
            return self.value - self.init.value
        return observed - self.value

    def how(self) -> str:
        text = f"banded: |step-1 - expected| <= {self.tolerance_name} {self.tolerance:g} ({self.source})"
        if self.init is not None:
            text += (f"; and that forward vs {self.init.value:.6f} ({self.init.source}) within "
                     f"{self.init.tolerance_name} {self.init.tolerance:g}")
        return text

    def observations(self, observed: float) -> dict:
        """What the first-step check records: ``deviation`` (above), the value and the
        observed loss; with an ``init``, each comparison's own deviation as well."""
        out = {"deviation": self.deviation(observed), "expected": self.value, "observed": observed}
        if self.init is not None:
            out.update(forward_deviation=observed - self.value,
                       init_deviation=self.value - self.init.value,
                       analytic_random_init=self.init.value)
        return out


def _recorded_loss(model: str, mask: str, dp: int, generation: str,
                   key: str | None = None) -> tuple[float, str]:
    """``model``'s recorded loss with ``mask`` at shape ``key`` (default: the tiny runs' shape
    at data-parallel degree ``dp``)."""
    path = paths.FIXTURES / model / "recorded_losses.json"
    recorded = json.loads(path.read_text())
    key = key or f"dp{dp}_lbs2_seq256"
    try:
        value = recorded[generation][mask][key]
    except KeyError:
        raise MissingExpectation(
            f"{path} records no {mask} first-step loss for torchtitan API generation "
            f"{generation!r} at data-parallel degree {dp} ({generation}.{mask}.{key}): record it "
            f"with `python scripts/make_fixtures.py --only recorded` in that generation's "
            f"environment (add {key} to RECORD_SHAPES for another degree)") from None
    return float(value), f"{path.parent.name}/recorded_losses.json {generation}.{mask}.{key}"


def model_config(model: str, model_dir: str | Path | None = None) -> dict:
    """The config.json of ``model``: a full-size run's own (``model_dir``, its assets), else
    the fixtures'."""
    if model_dir is not None:  # a full-size run: the config.json of its own assets
        return read_config_json(model_dir)
    for root in (paths.FIXTURES, paths.FIXTURES / "reference_configs"):
        if (root / model / "config.json").is_file():
            return read_config_json(root / model)
    raise FileNotFoundError(f"no config.json for model {model!r} under {paths.FIXTURES}")


def _known_issue_name(name: str | None, key: tuple[str, ...], path: Path) -> str | None:
    """``name`` if it names a registered known issue (an entry's ``unless_tied``), else an error
    naming the entry."""
    if name is None:
        return None
    try:
        known_issues.issue(name)
    except KeyError:
        raise ValueError(f"expectation {key} in {path}: unless_tied = {name!r} is not a known issue "
                         f"in harness/registry/known_issues/") from None
    return name


def _api_generation(generation: str | None) -> str:
    """Expectations are the API's: a fork (TorchTitan Neuron) shares its base's init rules and
    dataloader, so its expected numbers (harness/upstream/titan_api API_OF)."""
    return api_generation_of(generation or installed_generation())


def lm_head_std_rule(backend: str, generation: str | None = None,
                     path: Path = EXPECTATIONS_FILE) -> str:
    """The rule ``backend``'s lm_head init std is configured with (its random-init entries'
    ``lm_head_std``: the same init code at every width)."""
    generation = _api_generation(generation)
    entries = [e for e in tomllib.loads(Path(path).read_text())["expectation"]
               if e["backend"] == backend and "analytic_random_init" in e]
    own = [e for e in entries if e.get("generation") == generation]
    rules = {str(e["analytic_random_init"]["lm_head_std"])
             for e in (own or [e for e in entries if "generation" not in e])}
    if len(rules) != 1:
        raise MissingExpectation(f"{path}: backend {backend!r} needs exactly one lm_head_std rule "
                                 f"among its analytic_random_init entries, found {sorted(rules)}")
    return rules.pop()


class ExpectationRegistry:
    """Entries keyed by backend, model, init, device kind and attention mask; "any" in the
    device or mask of an entry matches every value, and an exact entry wins over "any"."""

    def __init__(self, path: Path = EXPECTATIONS_FILE) -> None:
        data = tomllib.loads(Path(path).read_text())
        self.path = Path(path)
        self.entries: list[dict] = data["expectation"]

    def keys(self) -> list[tuple[str, ...]]:
        return [(e["backend"], e["model"], e["init"], e["device"], e.get("mask", "any"),
                 e.get("generation", "any")) for e in self.entries]

    def rule(self, backend: str, model: str, init: str, device: str, mask: str = "causal",
             dp: int = 2, generation: str | None = None,
             own_config: bool = False) -> ExpectationRule:
        """The rule a run's first-step loss is held to; ``dp`` is its data-parallel degree (a
        recorded loss depends on the global batch), ``generation`` its torchtitan API
        generation (default: the installed one), ``own_config`` whether it read a config.json
        of its own (a full-size run's assets: a backend's "any" model entries apply)."""
        generation = _api_generation(generation)

        def score(entry):  # exact matches first; a model's own entries before "any" model's
            return (4 * (entry["model"] != model) + (entry["device"] != device)
                    + (entry.get("mask", "any") != mask) + (entry.get("generation", "any") != generation))

        matches = sorted(
            (e for e in self.entries
             if (e["backend"], e["init"]) == (backend, init)
             # "any" model: the backend's rule on a model's own config.json, so only for a run
             # that read one (a full-size run's model_dir)
             and (e["model"] == model or (e["model"] == "any" and own_config))
             and e["device"] in (device, "any") and e.get("mask", "any") in (mask, "any")
             and e.get("generation", "any") in (generation, "any")),
            key=score)
        if not matches:
            raise MissingExpectation(
                f"no expectation for backend={backend!r} model={model!r} init={init!r} "
                f"device={device!r} mask={mask!r} generation={generation!r} in {self.path}; "
                f"known keys: {self.keys()}")
        entry = matches[0]
        key = (backend, model, init, entry["device"], entry.get("mask", "any"),
               entry.get("generation", "any"))
        rule = ExpectationRule(key, loss_band(entry["tolerance"]),
                               initial_weights_forward=bool(entry.get("initial_weights_forward")))
        if "value" in entry:
            return replace(rule, value=float(entry["value"]),
                           source=f"published value in {self.path.name}")
        if "recorded" in entry:
            value, source = _recorded_loss(model, entry["recorded"], dp, generation)
            return replace(rule, value=value, source=source)
        if "analytic_random_init" in entry:
            analytic = entry["analytic_random_init"]
            return replace(rule, lm_head_std=str(analytic["lm_head_std"]),
                           analytic_unless_tied=_known_issue_name(analytic.get("unless_tied"), key,
                                                                  self.path))
        if entry.get("hf_forward"):
            return replace(rule, hf_forward=True)
        raise ValueError(f"expectation {key} in {self.path} gives no value source")

    def published(self, run) -> Expectation | None:
        """The source's published first-step loss for ``run``, where it has one: same backend,
        model, init, device, and the source's data (``[[published]]`` entries)."""
        spec = run.spec
        for entry in self.published_entries:
            if ((entry["backend"], entry["model"], entry["init"], entry["device"])
                    == (spec.backend, spec.model, spec.init, run.device)):
                if entry["data"] != spec.data:
                    return None
                band = loss_band(entry["tolerance"])
                value, source = self._published_value(entry, run)
                return Expectation((spec.backend, spec.model, spec.init, run.device, entry["data"]),
                                   value, band.value, band.name, source)
        return None

    def _published_value(self, entry: dict, run) -> tuple[float, str]:
        """A published number (``value``), or its stand-in where the source's model and data
        cannot run (the CPU twin reading fixtures/c4): the recorded loss of the twin's weights
        on that data (``recorded`` masking at ``shape`` of ``recorded_from``)."""
        if "value" in entry:
            return float(entry["value"]), f"published value in {self.path.name} (on {entry['data']})"
        value, source = _recorded_loss(entry["recorded_from"], entry["recorded"], run.nproc,
                                       _api_generation(run.versions.get("torchtitan-generation")),
                                       key=entry["shape"])
        return value, f"stand-in for the published value: {source} (on {entry['data']})"

    @property
    def published_entries(self) -> list[dict]:
        return tomllib.loads(self.path.read_text()).get("published", [])

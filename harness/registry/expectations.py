"""Expected first-step losses: the registry of fixtures/expectations.toml, the one home of its
lookup (``ExpectationRegistry``, ``Expectation``) and of the values it derives from data alone
(the recorded losses, the analytic random-init loss ``ln V + s^2/2`` and its init std rules).

Like HF's ``Expectations``, values are keyed by where they apply (backend, model, init, device
kind); unlike it, there is no "closest key" fallback: a missing key is an error that names it.

The entries whose value is computed from a launched run (``hf_forward``, and a random-init
run's ``initial_weights_forward``) are computed by the forwards the caller passes in
(``RunForwards``; harness/checks/reference_forward.py ``FORWARDS``): this registry reads data and
imports no computation.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.registry import paths
from harness.registry.tolerances import RANDOM_INIT_DRAW, LossBand, loss_band
from harness.registry.generations import api_generation_of, installed_generation
from harness.registry.hf_config import read_config_json

EXPECTATIONS_FILE = paths.FIXTURES / "expectations.toml"


class MissingExpectation(KeyError):
    pass


@dataclass(frozen=True)
class RunForwards:
    """How a launched run's computed expectations are computed (harness/checks/reference_forward.py
    ``FORWARDS``): ``hf_forward(run) -> (value, source)`` and ``initial_weights_forward(run) ->
    (value, source, band)``, or None where the run dumped nothing to recompute it from."""

    hf_forward: Callable[[Any], tuple[float, str]]
    initial_weights_forward: Callable[[Any], "tuple[float, str, LossBand] | None"]
    # a full-size run's model config dir (its assets); None: the fixtures' by model key
    model_dir: Callable[[Any], "Path | None"] = lambda run: None


@dataclass(frozen=True)
class Expectation:
    key: tuple[str, ...]  # the entry's (backend, model, init, device, mask)
    value: float
    tolerance: float
    tolerance_name: str
    source: str  # how the value was obtained, for messages and reports
    # A random-init run held to the forward of its own step-0 weights (``value``) is also held
    # to what a random init of its configured scale gives: that forward against ln V + s^2/2,
    # in the draw band (``init``; harness/registry/tolerances.py RANDOM_INIT_DRAW).
    init: "Expectation | None" = None
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


def analytic_random_init_loss(vocab_size: int, hidden_size: int, lm_head_std: float) -> float:
    """E[CE] of logits ~ N(0, s^2) with s^2 = std^2 * hidden (|RMSNorm(h)|^2 = hidden)."""
    variance = lm_head_std**2 * hidden_size
    return math.log(vocab_size) + variance / 2


def _model_config(model: str, model_dir: str | Path | None = None) -> dict:
    if model_dir is not None:  # a full-size run: the config.json of its own assets
        return read_config_json(model_dir)
    for root in (paths.FIXTURES, paths.FIXTURES / "reference_configs"):
        if (root / model / "config.json").is_file():
            return read_config_json(root / model)
    raise FileNotFoundError(f"no config.json for model {model!r} under {paths.FIXTURES}")


def _api_generation(generation: str | None) -> str:
    """Expectations are the API's: a fork (TorchTitan Neuron) shares its base's init rules and
    dataloader, so its expected numbers (harness/upstream/titan_api API_OF)."""
    return api_generation_of(generation or installed_generation())


def truncated_normal_std(std: float, cutoff: float) -> float:
    """The std of N(0, std^2) cut at +-cutoff*std (``nn.init.trunc_normal_(std=s, a=-c*s,
    b=c*s)``): the std it is given is the untruncated normal's; at c = 3 the variance drawn is
    0.9733 of it (1 - 2c*phi(c) / (2*Phi(c) - 1))."""
    phi = math.exp(-cutoff * cutoff / 2) / math.sqrt(2 * math.pi)
    mass = math.erf(cutoff / math.sqrt(2))
    return std * math.sqrt(1 - 2 * cutoff * phi / mass)


def _std_rule(rule, hidden: int) -> float:
    """The std the lm_head is drawn with: ``0.02`` (a plain normal), ``hidden^-0.5``, or
    ``trunc3(hidden^-0.5)`` (that std, cut at +-3 std, as torchtitan's output inits do)."""
    rule = str(rule)
    truncated = re.fullmatch(r"trunc(\d+(?:\.\d+)?)\((.+)\)", rule)
    if truncated:
        return truncated_normal_std(_std_rule(truncated.group(2), hidden), float(truncated.group(1)))
    return hidden ** -0.5 if rule == "hidden^-0.5" else float(rule)


def configured_lm_head_std(backend: str, hidden: int, generation: str | None = None,
                           path: Path = EXPECTATIONS_FILE) -> float:
    """The lm_head init std ``backend`` is configured with at width ``hidden``: its random-init
    entries' rule (the same init code at every width), never a std measured on a model."""
    generation = _api_generation(generation)
    entries = [e for e in tomllib.loads(Path(path).read_text())["expectation"]
               if e["backend"] == backend and "analytic_random_init" in e]
    own = [e for e in entries if e.get("generation") == generation]
    rules = {str(e["analytic_random_init"]["lm_head_std"])
             for e in (own or [e for e in entries if "generation" not in e])}
    if len(rules) != 1:
        raise MissingExpectation(f"{path}: backend {backend!r} needs exactly one lm_head_std rule "
                                 f"among its analytic_random_init entries, found {sorted(rules)}")
    return _std_rule(rules.pop(), hidden)


def _analytic(model: str, spec: dict, model_dir=None) -> tuple[float, str]:
    hf = _model_config(model, model_dir)
    std = _std_rule(spec["lm_head_std"], hf["hidden_size"])
    value = analytic_random_init_loss(hf["vocab_size"], hf["hidden_size"], float(std))
    return value, f"ln V + std^2*hidden/2 (V={hf['vocab_size']}, hidden={hf['hidden_size']}, std={std:.4g})"


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

    def get(self, backend: str, model: str, init: str, device: str, mask: str = "causal",
            dp: int = 2, generation: str | None = None, run=None,
            model_dir: str | Path | None = None, forwards: RunForwards | None = None) -> Expectation:
        """The expected first-step loss of a run; ``dp`` is its data-parallel degree (a recorded
        loss depends on the global batch), ``generation`` its torchtitan API generation
        (default: the installed one). A launched ``run`` comes with the ``forwards`` that
        compute its computed entries."""
        if (run is None) != (forwards is None):
            raise TypeError("a launched run's expectation needs the forwards that compute it, and "
                            "they need the run: pass both (harness/checks/reference_forward.py FORWARDS)")
        generation = _api_generation(generation)

        def score(entry):  # exact matches first; a model's own entries before "any" model's
            return (4 * (entry["model"] != model) + (entry["device"] != device)
                    + (entry.get("mask", "any") != mask) + (entry.get("generation", "any") != generation))

        matches = sorted(
            (e for e in self.entries
             if (e["backend"], e["init"]) == (backend, init)
             # "any" model: the backend's rule on a model's own config.json, so only for a run
             # that read one (a full-size run's model_dir)
             and (e["model"] == model or (e["model"] == "any" and model_dir is not None))
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
        if "value" in entry:
            value, source = float(entry["value"]), f"published value in {self.path.name}"
        elif "recorded" in entry:
            value, source = _recorded_loss(model, entry["recorded"], dp, generation)
        elif "analytic_random_init" in entry:
            value, source = _analytic(model, entry["analytic_random_init"], model_dir)
            forward = (forwards.initial_weights_forward(run)
                       if run is not None and entry.get("initial_weights_forward") else None)
            if forward is not None:
                init = Expectation(key, value, RANDOM_INIT_DRAW.value, RANDOM_INIT_DRAW.name,
                                   source, what="step-0 weights' forward")
                band = forward[2]
                return Expectation(key, forward[0], band.value, band.name, forward[1], init=init)
        elif entry.get("hf_forward"):
            if run is None:
                raise MissingExpectation(f"{key}: an hf_forward expectation is computed from a "
                                         f"launched run")
            value, source = forwards.hf_forward(run)
        else:
            raise ValueError(f"expectation {key} in {self.path} gives no value source")
        band = loss_band(entry["tolerance"])
        return Expectation(key, value, band.value, band.name, source)

    def for_run(self, run, forwards: RunForwards) -> Expectation:
        """The expectation of a launched run (a RunResult), its computed entries computed by
        ``forwards`` (harness/checks/reference_forward.py ``FORWARDS``)."""
        spec = run.spec
        if spec.model is None:
            raise MissingExpectation(f"{spec.name}: the model it trains is not one the harness "
                                     f"knows, so it has no expectation")
        return self.get(spec.backend, spec.model, spec.init, run.device, spec.mask, run.nproc,
                        run.versions.get("torchtitan-generation"), run=run,
                        model_dir=forwards.model_dir(run), forwards=forwards)

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

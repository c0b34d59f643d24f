"""Expected first-step losses, read from fixtures/expectations.toml.

Like HF's ``Expectations``, values are keyed by where they apply (backend, model, init, device
kind); unlike it, there is no "closest key" fallback: a missing key is an error that names it.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness import paths
from harness.tolerances import loss_band

EXPECTATIONS_FILE = paths.FIXTURES / "expectations.toml"


class MissingExpectation(KeyError):
    pass


@dataclass(frozen=True)
class Expectation:
    key: tuple[str, ...]  # the entry's (backend, model, init, device, mask)
    value: float
    tolerance: float
    tolerance_name: str
    source: str  # how the value was obtained, for messages and reports

    def check(self, observed: float) -> str | None:
        """None when ``observed`` meets the expectation, else a message saying by how much not."""
        if math.isfinite(observed) and abs(observed - self.value) <= self.tolerance:
            return None
        return (
            f"first-step loss {observed:.6f} vs expected {self.value:.6f} "
            f"(diff {observed - self.value:+.3g}, |diff| > {self.tolerance_name} {self.tolerance:g}); "
            f"expected value from {self.source}; key {self.key}"
        )

    def deviation(self, observed: float) -> float:
        return observed - self.value


def _recorded_loss(model: str, mask: str, dp: int, generation: str) -> tuple[float, str]:
    path = paths.FIXTURES / model / "recorded_losses.json"
    recorded = json.loads(path.read_text())
    key = f"dp{dp}_lbs2_seq256"
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


def _model_config(model: str) -> dict:
    from harness.hf_config import read_config_json

    for root in (paths.FIXTURES, paths.FIXTURES / "reference_configs"):
        if (root / model / "config.json").is_file():
            return read_config_json(root / model)
    raise FileNotFoundError(f"no config.json for model {model!r} under {paths.FIXTURES}")


def _std_rule(rule, hidden: int) -> float:
    return hidden ** -0.5 if rule == "hidden^-0.5" else float(rule)


def configured_lm_head_std(backend: str, hidden: int, generation: str | None = None,
                           path: Path = EXPECTATIONS_FILE) -> float:
    """The lm_head init std ``backend`` is configured with at width ``hidden``: its random-init
    entries' rule (the same init code at every width), never a std measured on a model."""
    if generation is None:
        from harness.titan_api import generation as installed

        generation = installed()
    entries = [e for e in tomllib.loads(Path(path).read_text())["expectation"]
               if e["backend"] == backend and "analytic_random_init" in e]
    own = [e for e in entries if e.get("generation") == generation]
    rules = {str(e["analytic_random_init"]["lm_head_std"])
             for e in (own or [e for e in entries if "generation" not in e])}
    if len(rules) != 1:
        raise MissingExpectation(f"{path}: backend {backend!r} needs exactly one lm_head_std rule "
                                 f"among its analytic_random_init entries, found {sorted(rules)}")
    return _std_rule(rules.pop(), hidden)


def _analytic(model: str, spec: dict) -> tuple[float, str]:
    hf = _model_config(model)
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
            dp: int = 2, generation: str | None = None) -> Expectation:
        """The expected first-step loss of a run; ``dp`` is its data-parallel degree (a recorded
        loss depends on the global batch), ``generation`` its torchtitan API generation
        (default: the installed one)."""
        if generation is None:
            from harness.titan_api import generation as installed

            generation = installed()

        def score(entry):  # exact matches first
            return ((entry["device"] != device) + (entry.get("mask", "any") != mask)
                    + (entry.get("generation", "any") != generation))

        matches = sorted(
            (e for e in self.entries
             if (e["backend"], e["model"], e["init"]) == (backend, model, init)
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
            value, source = _analytic(model, entry["analytic_random_init"])
        else:
            raise ValueError(f"expectation {key} in {self.path} gives no value source")
        band = loss_band(entry["tolerance"])
        return Expectation(key, value, band.value, band.name, source)

    def for_run(self, run) -> Expectation:
        """The expectation of a launched run (a RunResult)."""
        if run.model is None:
            raise MissingExpectation(f"{run.name}: the model it trains is not one the harness "
                                     f"knows, so it has no expectation")
        return self.get(run.backend, run.model, run.init, run.device, run.mask, run.nproc,
                        run.versions.get("torchtitan-generation"))
